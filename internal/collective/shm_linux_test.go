//go:build linux

package collective

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"syscall"
	"testing"

	"github.com/kolo-dl/kolo/internal/dtype"
	"github.com/kolo-dl/kolo/internal/reduce"
	"github.com/kolo-dl/kolo/internal/transport"
	"github.com/kolo-dl/kolo/internal/transport/shm"
)

// Over a real segment, the exchanges that once went through the pair rings (an alltoall reserved
// every one of them: n² of /dev/shm) reserve nothing beyond what Open did; a plain Send does, which
// shows the measurement sees a ring when one is reserved.
func TestSharedExchangesReserveNoRings(t *testing.T) {
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=512m,huge=never"); err != nil {
		t.Skipf("needs a private tmpfs to count reserved pages (mount: %v)", err)
	}
	t.Cleanup(func() { syscall.Unmount(dir, 0) })
	used := func() int64 {
		var st syscall.Statfs_t
		if err := syscall.Statfs(dir, &st); err != nil {
			t.Fatalf("statfs %s: %v", dir, err)
		}
		return int64(st.Blocks-st.Bfree) * st.Bsize
	}
	const n, block = 8, 300_000
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	gs := openSegment(t, shm.Config{Name: "kolo-exchange-test", Size: n, Dir: dir})
	errs := make([]error, n)
	var wg sync.WaitGroup
	each := func(f func(r int, c transport.Comm) error) {
		t.Helper()
		for r := range n {
			wg.Go(func() { errs[r] = f(r, gs[r].Comm()) })
		}
		wg.Wait()
		for r, err := range errs {
			if err != nil {
				t.Fatalf("rank %d: %v", r, err)
			}
		}
	}
	base := used()
	each(func(r int, c transport.Comm) error {
		counts := slices.Repeat([]int{block}, n)
		recv := make([]byte, n*block)
		if err := Alltoall(ctx, c, bytes.Repeat([]byte{byte(r)}, n*block), counts, recv, counts, nil); err != nil {
			return err
		}
		if err := Allgather(ctx, c, make([]byte, block), recv, counts, nil); err != nil {
			return err
		}
		if err := Broadcast(ctx, c, make([]byte, 4*block), n-1, nil); err != nil {
			return err
		}
		return ReduceScatter(ctx, c, make([]byte, n*block), make([]byte, block), counts, dtype.Float32, reduce.Sum, nil)
	})
	if grew := used() - base; grew != 0 {
		t.Errorf("alltoall, allgather, broadcast and reduce-scatter of 8 ranks reserved %d bytes of rings; want none", grew)
	}
	each(func(r int, c transport.Comm) error {
		switch r {
		case 0:
			return c.Send(ctx, 1, make([]byte, 10))
		case 1:
			return c.Recv(ctx, 0, make([]byte, 10))
		}
		return nil
	})
	if used() == base {
		t.Errorf("a Send reserved nothing: the measurement does not see rings")
	}
}

// BenchmarkExchanges times allgather, broadcast, alltoall and reduce-scatter over a real segment
// (ranks are goroutines of this process, each with its own mapping), through the pair rings
// (Tuning.NoShared: the algorithms kolo used before) and through the slots, side by side, so that
// each pair of figures shares the machine's state. An op is timed from every rank's start to the
// last rank's end. Bytes per op are the per-rank size: a broadcast's buffer, an allgather's
// block, the share of an alltoall's or reduce-scatter's input that goes to each rank.
func BenchmarkExchanges(b *testing.B) {
	for _, n := range []int{2, 8} {
		b.Run(fmt.Sprintf("ranks=%d", n), func(b *testing.B) {
			gs := openSegment(b, shm.Config{Name: fmt.Sprintf("kolo-bench-exchanges-%d-%d", os.Getpid(), n), Size: n})
			for _, op := range []string{"allgather", "broadcast", "alltoall", "reducescatter"} {
				for _, size := range []int{4 << 10, 256 << 10, 4 << 20, 32 << 20} {
					for _, path := range []string{"rings", "slots"} {
						var tun *Tuning
						if path == "rings" {
							tun = &Tuning{NoShared: true}
						}
						b.Run(fmt.Sprintf("op=%s/bytes=%d/%s", op, size, path), func(b *testing.B) {
							counts := slices.Repeat([]int{size}, n)
							ins, outs := make([][]byte, n), make([][]byte, n)
							for r := range n {
								ins[r], outs[r] = make([]byte, n*size), make([]byte, n*size)
							}
							run := func(ctx context.Context, r int, c transport.Comm) error {
								switch op {
								case "allgather":
									return Allgather(ctx, c, ins[r][:size], outs[r], counts, tun)
								case "broadcast":
									return Broadcast(ctx, c, ins[r][:size], 0, tun)
								case "alltoall":
									return Alltoall(ctx, c, ins[r], counts, outs[r], counts, tun)
								}
								return ReduceScatter(ctx, c, ins[r], outs[r][:size], counts, dtype.Float32, reduce.Sum, tun)
							}
							comms := make([]transport.Comm, n)
							for r, g := range gs {
								comms[r] = g.Comm()
							}
							l := startLoop(comms, run)
							defer l.stop()
							if err := l.run(); err != nil { // warm buffers, rings, the store measurement
								b.Fatal(err)
							}
							b.SetBytes(int64(size))
							b.ResetTimer()
							for b.Loop() {
								if err := l.run(); err != nil {
									b.Fatal(err)
								}
							}
						})
					}
				}
			}
		})
	}
}

// openSegment opens every rank of cfg's segment in this process, each with its own mapping, and
// closes them when the test ends.
func openSegment(t testing.TB, cfg shm.Config) []*shm.Group {
	t.Helper()
	gs := make([]*shm.Group, cfg.Size)
	errs := make([]error, cfg.Size)
	var wg sync.WaitGroup
	for r := range cfg.Size {
		wg.Go(func() {
			c := cfg
			c.Rank = r
			gs[r], errs[r] = shm.Open(context.Background(), c)
		})
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, g := range gs {
			if g != nil {
				g.Close()
			}
		}
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("open rank %d of segment %s: %v", r, cfg.Name, err)
		}
	}
	return gs
}
