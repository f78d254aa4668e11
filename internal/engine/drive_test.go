//go:build linux

package engine

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/transport"
	"github.com/kolo-dl/kolo/internal/transport/shm"
)

// The tests here check who drives the loop (drive.go): callers in Wait, the background goroutine
// for ops nobody waits on, hand-overs between them, over both kinds of Messenger: one read through
// its Inbox channel (inmem) and a transport.Poller (shm, one segment shared by engines of this
// process, as ranks of one host would).

var segments atomic.Int64

// newShmCluster is newCluster over a shared-memory segment.
func newShmCluster(t testing.TB, n int, cfg Config) *cluster {
	t.Helper()
	cfgs := make([]Config, n)
	for r := range cfgs {
		cfgs[r] = cfg
	}
	return newShmClusterEach(t, cfgs)
}

// newShmClusterEach is newShmCluster with a config per rank.
func newShmClusterEach(t testing.TB, cfgs []Config) *cluster {
	t.Helper()
	return newShmClusterEdit(t, cfgs, nil)
}

// newShmClusterEdit is newShmClusterEach whose ranks' Groups edit may change before their engines
// start (a test wraps a rank's transport).
func newShmClusterEdit(t testing.TB, cfgs []Config, edit func(r int, g *Group)) *cluster {
	t.Helper()
	n := len(cfgs)
	name := fmt.Sprintf("kolo-engine-test-%d-%d", os.Getpid(), segments.Add(1))
	dir := t.TempDir()
	gs := make([]*shm.Group, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			gs[r], errs[r] = shm.Open(context.Background(), shm.Config{Name: name, Rank: r, Size: n,
				SlotBytes: 64 << 10, RingBytes: 64 << 10, MsgRingBytes: 4 << 10, Dir: dir, Timeout: 10 * time.Second})
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	groups := make([]Group, n)
	for r, g := range gs {
		if _, ok := transport.PollerOf(g.Messenger()); !ok {
			t.Fatal("shm messenger lost its Poller capability")
		}
		groups[r] = Group{Comm: g.Comm(), Messenger: g.Messenger(), Local: g.Comm(), Abort: g.Abort}
		if edit != nil {
			edit(r, &groups[r])
		}
	}
	c := startClusterEach(t, cfgs, "shmhost", groups, func() {
		for _, g := range gs {
			g.Close()
		}
	})
	c.close = func(r int) { gs[r].Close() }
	return c
}

// transports runs f with a fresh cluster of each kind, spinning and not.
func transports(t *testing.T, n int, cfg Config, f func(t *testing.T, c *cluster)) {
	for _, kind := range []string{"inmem", "shm"} {
		for _, spin := range []time.Duration{0, 30 * time.Microsecond} {
			t.Run(fmt.Sprintf("%s/spin=%v", kind, spin), func(t *testing.T) {
				cfg := cfg
				cfg.Spin = spin
				if kind == "inmem" {
					f(t, newCluster(t, n, cfg))
				} else {
					f(t, newShmCluster(t, n, cfg))
				}
			})
		}
	}
}

// input is rank r's data for op name: small integers, so float32 sums are exact.
func input(name string, r, n int) []float32 {
	h := fnv.New64a()
	h.Write([]byte(name))
	rng := rand.New(rand.NewPCG(h.Sum64(), uint64(r)))
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.IntN(1000) - 500)
	}
	return v
}

// Several goroutines per rank submit ops of awkward sizes, some waiting at once and some in a
// batch waited in reverse; every result equals the naive sum over ranks.
func TestDrivenOpsMatchReference(t *testing.T) {
	const ranks, goroutines, ops = 3, 3, 12
	sizes := []int{0, 1, 3, 7, 31, 1000, 4099}
	transports(t, ranks, DefaultConfig(), func(t *testing.T, c *cluster) {
		ctx := waitCtx(t)
		name := func(g, k int) string { return fmt.Sprintf("g%d.op%d", g, k) }
		size := func(g, k int) int { return sizes[(g*5+k)%len(sizes)] }
		want := func(g, k int) []float32 {
			sum := make([]float32, size(g, k))
			for r := range ranks {
				for i, v := range input(name(g, k), r, size(g, k)) {
					sum[i] += v
				}
			}
			return sum
		}
		var wg sync.WaitGroup
		errs := make(chan error, ranks*goroutines)
		for r := range ranks {
			for g := range goroutines {
				wg.Add(1)
				go func() {
					defer wg.Done()
					check := func(k int, buf []byte) error {
						got, w := getF32(buf), want(g, k)
						for i := range w {
							if got[i] != w[i] {
								return fmt.Errorf("rank %d %s: element %d = %v, want %v", r, name(g, k), i, got[i], w[i])
							}
						}
						return nil
					}
					submit := func(k int) ([]byte, *Handle) {
						buf := f32(input(name(g, k), r, size(g, k))...)
						return buf, c.engines[r].Enqueue(allreduceReq(name(g, k), size(g, k)), buf, buf)
					}
					// Blocking ops: submit, wait.
					for k := 0; k < ops/2; k++ {
						buf, h := submit(k)
						if err := h.Wait(ctx); err != nil {
							errs <- fmt.Errorf("rank %d: %w", r, err)
							return
						}
						if err := check(k, buf); err != nil {
							errs <- err
							return
						}
					}
					// Async ops: submit them all, wait in reverse.
					bufs := make([][]byte, ops)
					hs := make([]*Handle, ops)
					for k := ops / 2; k < ops; k++ {
						bufs[k], hs[k] = submit(k)
					}
					for k := ops - 1; k >= ops/2; k-- {
						if err := hs[k].Wait(ctx); err != nil {
							errs <- fmt.Errorf("rank %d: %w", r, err)
							return
						}
						if err := check(k, bufs[k]); err != nil {
							errs <- err
							return
						}
					}
				}()
			}
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	})
}

// An op nobody waits on still completes: the background goroutine picks it up.
func TestAsyncOpCompletesWithoutWait(t *testing.T) {
	transports(t, 2, DefaultConfig(), func(t *testing.T, c *cluster) {
		ctx := waitCtx(t)
		b0, b1 := f32(1, 2), f32(10, 20)
		h0 := c.engines[0].Enqueue(allreduceReq("nowait", 2), b0, b0)
		h1 := c.engines[1].Enqueue(allreduceReq("nowait", 2), b1, b1)
		for r, h := range []*Handle{h0, h1} {
			select {
			case <-h.Done():
			case <-ctx.Done():
				t.Fatalf("rank %d: op never completed without a Wait", r)
			}
			if err := h.Err(); err != nil {
				t.Fatalf("rank %d: %v", r, err)
			}
		}
		if got := getF32(b0); got[0] != 11 || got[1] != 22 {
			t.Fatalf("got %v, want [11 22]", got)
		}
	})
}

// An op submitted for a caller that waits at once (EnqueueWaited) arms no kick; a caller whose
// context has already ended still takes it to the coordinator, and the op completes without it.
func TestWaitedOpWhoseCallerLeftCompletes(t *testing.T) {
	transports(t, 2, DefaultConfig(), func(t *testing.T, c *cluster) {
		ctx := waitCtx(t)
		for r := range 2 {
			done, cancel := context.WithCancel(ctx)
			cancel()
			b := f32(float32(r + 1))
			h := c.engines[r].EnqueueWaited(allreduceReq("left", 1), b, b)
			if err := h.Wait(done); err == nil && !h.Poll() {
				t.Fatalf("rank %d: Wait with an ended context returned nil before the op completed", r)
			}
			defer func() {
				select {
				case <-h.Done():
				case <-ctx.Done():
					t.Fatalf("rank %d: the op whose caller left never completed", r)
				}
				if err := h.Err(); err != nil || getF32(b)[0] != 3 {
					t.Errorf("rank %d: %v, %v", r, err, getF32(b))
				}
			}()
		}
	})
}

// A Wait whose context ends while it drives returns the context's error promptly; the op then
// completes in the background once the peer submits. (Rank 1 waits: unlike the coordinator, it
// has no stall-inspector tick that would also wake its background goroutine.)
func TestWaitDeadlineWhileDriving(t *testing.T) {
	transports(t, 2, DefaultConfig(), func(t *testing.T, c *cluster) {
		ctx := waitCtx(t)
		b1 := f32(1)
		h1 := c.engines[1].Enqueue(allreduceReq("late", 1), b1, b1)
		short, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
		defer cancel()
		start := time.Now()
		if err := h1.Wait(short); !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), `"late"`) {
			t.Fatalf("Wait with a short deadline: %v", err)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Fatalf("Wait returned %v after its 30ms deadline", d)
		}
		b0 := f32(2)
		if err := c.engines[0].Enqueue(allreduceReq("late", 1), b0, b0).Wait(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case <-h1.Done():
		case <-ctx.Done():
			t.Fatal("the op whose waiter gave up never completed")
		}
		if err := h1.Wait(ctx); err != nil || getF32(b1)[0] != 3 {
			t.Fatalf("after completing: %v, %v", err, getF32(b1))
		}
	})
}

// The stall inspector runs while a caller drives and sleeps.
func TestStallInspectorWhileDriving(t *testing.T) {
	cfg := DefaultConfig()
	cfg.StallWarning = 100 * time.Millisecond
	cfg.StallShutdown = 300 * time.Millisecond
	transports(t, 2, cfg, func(t *testing.T, c *cluster) {
		buf := f32(1)
		err := c.engines[0].Enqueue(allreduceReq("never", 1), buf, buf).Wait(waitCtx(t))
		if err == nil || !strings.Contains(err.Error(), "rank 1") || !strings.Contains(err.Error(), "never") {
			t.Fatalf("err = %v, want a stall error naming rank 1", err)
		}
	})
}

// A rank whose transport closes under it: the other ranks' waiting callers fail quickly, naming it.
func TestLostRankFailsDriver(t *testing.T) {
	for _, tc := range []struct {
		spin   time.Duration
		yields int
	}{{0, 0}, {0, 32}, {30 * time.Microsecond, 0}} {
		t.Run(fmt.Sprintf("spin=%v/yields=%d", tc.spin, tc.yields), func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Spin, cfg.Yields = tc.spin, tc.yields
			c := newShmCluster(t, 3, cfg)
			ctx := waitCtx(t)
			errs := make(chan error, 2)
			for r := range 2 {
				go func() {
					buf := f32(1)
					errs <- c.engines[r].Enqueue(allreduceReq("x", 1), buf, buf).Wait(ctx)
				}()
			}
			time.Sleep(20 * time.Millisecond)
			start := time.Now()
			c.close(2)
			for range 2 {
				if err := <-errs; err == nil || !strings.Contains(err.Error(), "rank 2") {
					t.Errorf("err = %v, want rank 2 lost", err)
				}
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("took %v to notice", d)
			}
		})
	}
}

// The background goroutine drives async ops, gives way to a caller that starts waiting, and
// takes over again what that caller leaves behind, whether or not the caller took the token before
// its op completed. Rank 1 (no stall-inspector ticks) is the one watched.
func TestDriveHandsOverBetweenBackgroundAndCaller(t *testing.T) {
	transports(t, 2, DefaultConfig(), func(t *testing.T, c *cluster) {
		ctx := waitCtx(t)
		for i := range 20 {
			a, b := fmt.Sprintf("a%d", i), fmt.Sprintf("b%d", i)
			ba, bb := f32(1), f32(1)
			ha := c.engines[1].Enqueue(allreduceReq(a, 1), ba, ba)
			hb := c.engines[1].Enqueue(allreduceReq(b, 1), bb, bb)
			time.Sleep(2 * time.Millisecond) // the background goroutine takes them over
			done := make(chan error, 1)
			go func() {
				x := f32(1)
				err := c.engines[0].Enqueue(allreduceReq(a, 1), x, x).Wait(ctx)
				time.Sleep(time.Duration(i%3) * time.Millisecond)
				y := f32(1)
				done <- errors.Join(err, c.engines[0].Enqueue(allreduceReq(b, 1), y, y).Wait(ctx))
			}()
			if err := ha.Wait(ctx); err != nil {
				t.Fatal(err)
			}
			select {
			case <-hb.Done():
			case <-ctx.Done():
				t.Fatalf("round %d: op %q left behind by the caller never completed", i, b)
			}
			if err := errors.Join(hb.Err(), <-done); err != nil {
				t.Fatal(err)
			}
			if getF32(ba)[0] != 2 || getF32(bb)[0] != 2 {
				t.Fatalf("round %d: got %v %v, want 2 2", i, getF32(ba), getF32(bb))
			}
		}
	})
}

// Shutdown closes the engine while another caller drives an op still in flight: once that op is
// done, the loop ends (the departing driver hands the end to the background goroutine) instead of
// leaving Shutdown to wait for ShutdownWait. Shutdown's barrier is left out: it would complete the
// in-flight op first, and what is tested is closing under a driver.
func TestCloseWhileAnotherCallerDrives(t *testing.T) {
	transports(t, 2, DefaultConfig(), func(t *testing.T, c *cluster) {
		ctx := waitCtx(t)
		e := c.engines[1]
		b1 := f32(1)
		h1 := e.Enqueue(allreduceReq("x", 1), b1, b1)
		done := make(chan error, 1)
		go func() { done <- h1.Wait(ctx) }()
		time.Sleep(20 * time.Millisecond) // the caller drives, waiting for rank 0
		e.mu.Lock()
		e.closed = true // what Shutdown does after its barrier
		e.mu.Unlock()
		e.summonBackground()
		e.wakeDriver()
		b0 := f32(2)
		if err := errors.Join(c.engines[0].Enqueue(allreduceReq("x", 1), b0, b0).Wait(ctx), <-done); err != nil {
			t.Fatal(err)
		}
		select {
		case <-e.stopped:
		case <-time.After(5 * time.Second):
			t.Fatal("the loop did not end after the last op of a closed engine")
		}
		// Rank 0 leaves the same way, so that its Shutdown does not wait for rank 1's barrier.
		c.engines[0].mu.Lock()
		c.engines[0].closed = true
		c.engines[0].mu.Unlock()
		c.engines[0].summonBackground()
	})
}

// BenchmarkBlockingAllreduce is the latency of one small blocking allreduce between two engines of
// this process over shared memory, each rank's caller driving its own loop: the path
// `kolo bench allreduce -np 2 --sizes 4` measures across processes, minus process scheduling.
func BenchmarkBlockingAllreduce(b *testing.B) {
	for _, spin := range []time.Duration{0, 50 * time.Microsecond} {
		b.Run(fmt.Sprintf("4B/spin=%v", spin), func(b *testing.B) {
			cfg := DefaultConfig()
			cfg.Spin = spin
			benchAllreduces(b, newShmCluster(b, 2, cfg))
		})
	}
}

// benchAllreduces times b.N blocking 4-byte allreduces on every rank of c at once.
func benchAllreduces(b *testing.B, c *cluster) {
	ctx := context.Background()
	var wg sync.WaitGroup
	b.ResetTimer()
	for r, e := range c.engines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := f32(float32(r))
			for range b.N {
				if err := e.Enqueue(allreduceReq("bench", 1), buf, buf).Wait(ctx); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}
