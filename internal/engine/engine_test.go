package engine

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/dtype"
	"github.com/kolo-dl/kolo/internal/engine/negotiate"
	"github.com/kolo-dl/kolo/internal/reduce"
	"github.com/kolo-dl/kolo/internal/transport"
	"github.com/kolo-dl/kolo/internal/transport/inmem"
)

// cluster is n engines in one process over the in-memory transport.
type cluster struct {
	eps     []*inmem.Endpoint
	engines []*Engine
	close   func(r int) // closes rank r's transport under its engine (shm clusters)
}

func newCluster(t *testing.T, n int, cfg Config) *cluster {
	t.Helper()
	return newClusterWith(t, n, cfg, nil, nil)
}

// newClusterWith is newCluster over inmem.New(n, opts...), where edit, if not nil, changes rank r's
// Group (a Comm or Messenger that misbehaves, say) before its engine starts. Every rank's Comm and
// Local are ep.Comm(), which satisfies transport.Shared unless opts include inmem.WithoutShared.
func newClusterWith(t *testing.T, n int, cfg Config, opts []inmem.Option, edit func(r int, ep *inmem.Endpoint, g *Group)) *cluster {
	t.Helper()
	// A bug that has ranks run different collectives against each other fails the test with the
	// stuck rank and algorithm named, not at the package's timeout; a test's own option wins.
	opts = append([]inmem.Option{inmem.WithProgressTimeout(testProgressTimeout)}, opts...)
	eps := inmem.New(n, opts...)
	groups := make([]Group, n)
	for r, ep := range eps {
		groups[r] = Group{Comm: ep.Comm(), Messenger: ep, Local: ep.Comm()}
		if edit != nil {
			edit(r, ep, &groups[r])
		}
	}
	c := startCluster(t, cfg, "memhost", groups, func() {
		for _, ep := range eps {
			ep.Close()
		}
	})
	c.eps = eps
	return c
}

// testProgressTimeout is the inmem progress deadline of the engine tests' clusters: far beyond
// any healthy test's waits.
const testProgressTimeout = 2 * time.Minute

// startCluster starts one engine per group (filling in rank, size, hosts and local ranks: all on
// one host) and, at cleanup, shuts them all down together and then runs closeAll.
func startCluster(t testing.TB, cfg Config, host string, groups []Group, closeAll func()) *cluster {
	t.Helper()
	cfgs := make([]Config, len(groups))
	for r := range cfgs {
		cfgs[r] = cfg
	}
	return startClusterEach(t, cfgs, host, groups, closeAll)
}

// startClusterEach is startCluster with a config per rank.
func startClusterEach(t testing.TB, cfgs []Config, host string, groups []Group, closeAll func()) *cluster {
	t.Helper()
	n := len(groups)
	ranks := make([]int, n)
	hosts := make([]string, n)
	for i := range ranks {
		ranks[i], hosts[i] = i, host
	}
	c := &cluster{}
	t.Cleanup(func() {
		var wg sync.WaitGroup
		for _, e := range c.engines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				e.Shutdown(ctx)
			}()
		}
		wg.Wait()
		closeAll()
	})
	for r, g := range groups {
		g.Rank, g.Size, g.Hosts, g.LocalRanks = r, n, hosts, ranks
		e, err := New(cfgs[r], g)
		if err != nil {
			t.Fatal(err)
		}
		c.engines = append(c.engines, e)
	}
	return c
}

func f32(vals ...float32) []byte {
	b := make([]byte, 4*len(vals))
	for i, v := range vals {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return b
}

func getF32(b []byte) []float32 {
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

func allreduceReq(name string, n int) negotiate.Request {
	return negotiate.Request{Name: name, Kind: negotiate.Allreduce, DType: dtype.Float32, Shape: []int64{int64(n)}, ReduceOp: uint8(reduce.Sum)}
}

// waitCtx bounds a test's waits: a hang fails the test instead of the run. It is a whole test's
// budget (many ops share it), so it is long enough for a 2-core machine running other suites too,
// where 10 s was once missed by a healthy run.
func waitCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// Ranks submit the same tensors in opposite orders; every result is the sum, and tensors fused.
func TestAllreduceAnyOrderFused(t *testing.T) {
	const n, tensors = 3, 20
	c := newCluster(t, n, DefaultConfig())
	ctx := waitCtx(t)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for r := 0; r < n; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			bufs := make([][]byte, tensors)
			hs := make([]*Handle, tensors)
			for k := 0; k < tensors; k++ {
				i := k
				if r%2 == 1 {
					i = tensors - 1 - k
				}
				bufs[i] = f32(float32(r+1), float32(i))
				hs[i] = c.engines[r].Enqueue(allreduceReq(fmt.Sprintf("t%d", i), 2), bufs[i], bufs[i])
			}
			for i, h := range hs {
				if err := h.Wait(ctx); err != nil {
					errs <- err
					return
				}
				got := getF32(bufs[i])
				if got[0] != n*(n+1)/2 || got[1] != float32(n*i) {
					errs <- fmt.Errorf("rank %d tensor %d: got %v", r, i, got)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestMismatchFailsOpEverywhere(t *testing.T) {
	const n = 3
	c := newCluster(t, n, DefaultConfig())
	ctx := waitCtx(t)
	hs := make([]*Handle, n)
	for r := 0; r < n; r++ {
		size := 4
		if r == 2 {
			size = 5
		}
		buf := make([]byte, 4*size)
		hs[r] = c.engines[r].Enqueue(allreduceReq("w", size), buf, buf)
	}
	for r, h := range hs {
		err := h.Wait(ctx)
		var oe *OpError
		if !errors.As(err, &oe) || !strings.Contains(err.Error(), `"w"`) || !strings.Contains(err.Error(), "rank 2") {
			t.Errorf("rank %d: err = %v, want an OpError naming \"w\" and rank 2", r, err)
		}
		if !errors.Is(err, ErrMismatch) {
			t.Errorf("rank %d: %v does not match ErrMismatch", r, err)
		}
	}
	// The job goes on.
	for r := 0; r < n; r++ {
		buf := f32(1)
		hs[r] = c.engines[r].Enqueue(allreduceReq("after", 1), buf, buf)
	}
	for r, h := range hs {
		if err := h.Wait(ctx); err != nil {
			t.Errorf("rank %d after mismatch: %v", r, err)
		}
	}
}

func TestLocalValidation(t *testing.T) {
	c := newCluster(t, 1, DefaultConfig())
	e := c.engines[0]
	buf := make([]byte, 8)
	cases := []struct {
		req  negotiate.Request
		in   []byte
		want string
	}{
		{negotiate.Request{Kind: negotiate.Allreduce, DType: dtype.Float32, Shape: []int64{2}}, buf, "need a name"},
		{allreduceReq("x", 3), buf, "needs 12 bytes, input has 8"},
		// 1<<66 bytes, which wrapping int64 arithmetic would make 0: the length of the empty input
		{negotiate.Request{Name: "huge", Kind: negotiate.Allreduce, DType: dtype.Float32, Shape: []int64{1 << 62, 4}}, []byte{}, "more bytes than any memory holds"},
		{negotiate.Request{Name: "neg", Kind: negotiate.Allreduce, DType: dtype.Float32, Shape: []int64{2, -1}}, buf, "negative dimension in shape [2 -1]"},
		{negotiate.Request{Name: "b", Kind: negotiate.Broadcast, DType: dtype.Float32, Shape: []int64{2}, Root: 4}, buf, "root 4 outside"},
		{negotiate.Request{Name: "a", Kind: negotiate.Alltoall, DType: dtype.Float32, Shape: []int64{2}, Splits: []int64{1, 1}}, buf, "2 splits for 1 ranks"},
	}
	for _, tc := range cases {
		err := e.Enqueue(tc.req, tc.in, tc.in).Wait(waitCtx(t))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: err %v, want %q", tc.req, err, tc.want)
		}
	}
}

func TestDuplicateInFlightName(t *testing.T) {
	c := newCluster(t, 2, DefaultConfig())
	buf1, buf2 := f32(1), f32(2)
	h1 := c.engines[0].Enqueue(allreduceReq("dup", 1), buf1, buf1)
	h2 := c.engines[0].Enqueue(allreduceReq("dup", 1), buf2, buf2)
	// Refused at submission (Horovod raises at the call), without a turn: the first holds it.
	var ae *ArgumentError
	if !h2.Poll() || !errors.As(h2.Err(), &ae) || !errors.Is(h2.Err(), ErrDuplicateName) {
		t.Fatalf("second in-flight op with the same name: done %v, %v", h2.Poll(), h2.Err())
	}
	// The same name in another process set, or another name, is not a duplicate.
	other := f32(1)
	h4 := c.engines[0].Enqueue(allreduceReq("dup2", 1), other, other)
	b := f32(5)
	h3 := c.engines[1].Enqueue(allreduceReq("dup", 1), b, b)
	other1 := f32(2)
	h5 := c.engines[1].Enqueue(allreduceReq("dup2", 1), other1, other1)
	if err := errors.Join(h1.Wait(waitCtx(t)), h3.Wait(waitCtx(t)), h4.Wait(waitCtx(t)), h5.Wait(waitCtx(t))); err != nil {
		t.Fatal(err)
	}
	if got := getF32(buf1)[0]; got != 6 {
		t.Errorf("got %v, want 6", got)
	}
	// Once completed, the name is free again at once.
	again := []*Handle{c.engines[0].Enqueue(allreduceReq("dup", 1), buf1, buf1), c.engines[1].Enqueue(allreduceReq("dup", 1), b, b)}
	for r, h := range again {
		if err := h.Wait(waitCtx(t)); err != nil {
			t.Fatalf("rank %d: the name of a completed op: %v", r, err)
		}
	}
}

// An op that one rank refuses on its own (its arguments are wrong there) fails on every rank, at
// once, with that rank's reason; the next op works.
func TestRefusalFailsEveryRank(t *testing.T) {
	c := newCluster(t, 3, DefaultConfig())
	ctx := waitCtx(t)
	hs := make([]*Handle, 3)
	for r := range 3 {
		buf := f32(1, 2)
		req := allreduceReq("r", 2)
		if r == 1 {
			buf = f32(1) // 4 bytes for a [2] float32: wrong on this rank alone
		}
		hs[r] = c.engines[r].Enqueue(req, buf, buf)
	}
	var ae *ArgumentError
	if !hs[1].Poll() || !errors.As(hs[1].Err(), &ae) {
		t.Fatalf("rank 1, the refusing rank: done %v, %v; want an ArgumentError at once", hs[1].Poll(), hs[1].Err())
	}
	start := time.Now()
	for _, r := range []int{0, 2} {
		err := hs[r].Wait(ctx)
		var oe *OpError
		if !errors.As(err, &oe) || !strings.Contains(err.Error(), `allreduce "r": rank 1 refused it: shape [2] of float32 needs 8 bytes, input has 4`) {
			t.Errorf("rank %d: %v", r, err)
		}
		if !errors.Is(err, ErrMismatch) {
			t.Errorf("rank %d: %v does not match ErrMismatch (the op cannot run as submitted)", r, err)
		}
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("the refusal took %v to fail the other ranks", d)
	}
	// A refusal the caller makes itself (the API layer's checks) works the same way, and the
	// name is free again at once to the refusing rank's caller (TestSubmitAgainAfterRefusal).
	for round := range 2 {
		for r := range 3 {
			buf := f32(float32(r))
			req := allreduceReq("next", 1)
			if round == 0 && r == 2 {
				req.Error = "dtype bool is not supported"
			}
			hs[r] = c.engines[r].Enqueue(req, buf, buf)
		}
		for r, h := range hs {
			err := h.Wait(ctx)
			if round == 1 && err != nil {
				t.Errorf("round 1, rank %d: %v", r, err)
			}
			if round == 0 && (err == nil || !strings.Contains(err.Error(), "dtype bool is not supported")) {
				t.Errorf("round 0, rank %d: %v", r, err)
			}
		}
	}
}

// A rank that refused an op may submit its name again at once, before the coordinator has
// answered the refusal: the new op waits for that answer instead of failing as a duplicate on
// this rank alone (the other ranks' submissions of it would then wait for this rank forever, and
// the ranks' ops drift apart).
func TestSubmitAgainAfterRefusal(t *testing.T) {
	c := newCluster(t, 2, DefaultConfig())
	ctx := waitCtx(t)
	for round := range 30 {
		// Round 0 mod 2: both ranks refuse "x", then submit it again; else rank 0 alone
		// refuses, and rank 1's first "x" fails with rank 0's reason.
		var retry [2]*Handle
		var bufs [2][]byte
		for r := range 2 {
			refused := allreduceReq("x", 1)
			refused.Error = "refused by the test"
			first := f32(9)
			var h *Handle
			if r == 0 || round%2 == 0 {
				h = c.engines[r].Enqueue(refused, first, first)
			} else {
				h = c.engines[r].Enqueue(allreduceReq("x", 1), first, first)
			}
			if r == 0 || round%2 == 0 {
				var ae *ArgumentError
				if !h.Poll() || !errors.As(h.Err(), &ae) {
					t.Fatalf("round %d, rank %d: the refusal: done %v, %v", round, r, h.Poll(), h.Err())
				}
			} else if err := h.Wait(ctx); !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), "refused by the test") {
				t.Fatalf("round %d, rank %d: the op rank 0 refused: %v", round, r, err)
			}
			bufs[r] = f32(float32(r + 1))
			retry[r] = c.engines[r].Enqueue(allreduceReq("x", 1), bufs[r], bufs[r])
		}
		for r, h := range retry {
			if err := h.Wait(ctx); err != nil {
				t.Fatalf("round %d, rank %d: the op submitted again: %v", round, r, err)
			}
			if got := getF32(bufs[r])[0]; got != 3 {
				t.Fatalf("round %d, rank %d: got %v, want 3", round, r, got)
			}
		}
	}
	// A second op of the name while the first waits behind the refusal is a duplicate.
	refused := allreduceReq("y", 1)
	refused.Error = "refused by the test"
	b := f32(1)
	c.engines[0].Enqueue(refused, b, b)
	b1, b2 := f32(1), f32(1)
	h1 := c.engines[0].Enqueue(allreduceReq("y", 1), b1, b1)
	if h2 := c.engines[0].Enqueue(allreduceReq("y", 1), b2, b2); !h2.Poll() || !errors.Is(h2.Err(), ErrDuplicateName) {
		t.Errorf("a second op behind the refusal: done %v, %v; want ErrDuplicateName", h2.Poll(), h2.Err())
	}
	ob := f32(1)
	if err := c.engines[1].Enqueue(allreduceReq("y", 1), ob, ob).Wait(ctx); !errors.Is(err, ErrMismatch) {
		t.Errorf("rank 1's first \"y\", which rank 0 refused: %v", err)
	}
	ob2 := f32(1)
	h := c.engines[1].Enqueue(allreduceReq("y", 1), ob2, ob2)
	if err := errors.Join(h1.Wait(ctx), h.Wait(ctx)); err != nil {
		t.Fatal(err)
	}
}

// A rank that dies mid-job: every other rank's pending op fails quickly, naming it.
func TestLostRankFailsPendingOps(t *testing.T) {
	const n = 3
	c := newCluster(t, n, DefaultConfig())
	ctx := waitCtx(t)
	// Ranks 0 and 1 submit; rank 2 dies instead.
	hs := make([]*Handle, 2)
	for r := 0; r < 2; r++ {
		buf := f32(1)
		hs[r] = c.engines[r].Enqueue(allreduceReq("x", 1), buf, buf)
	}
	time.Sleep(20 * time.Millisecond)
	c.eps[2].Kill(errors.New("killed by test"))
	for r, h := range hs {
		start := time.Now()
		err := h.Wait(ctx)
		if err == nil || !errors.Is(err, transport.ErrPeerLost) && !strings.Contains(err.Error(), "rank 2") {
			t.Errorf("rank %d: err = %v, want rank 2 lost", r, err)
		}
		if errors.Is(err, ErrMismatch) {
			t.Errorf("rank %d: a lost rank's error %v matches ErrMismatch", r, err)
		}
		if time.Since(start) > 5*time.Second {
			t.Errorf("rank %d took %v", r, time.Since(start))
		}
	}
	// Later ops fail at once with the same cause.
	buf := f32(1)
	if err := c.engines[0].Enqueue(allreduceReq("y", 1), buf, buf).Wait(ctx); err == nil || !strings.Contains(err.Error(), "rank 2") {
		t.Errorf("op after the loss: %v", err)
	}
}

func TestStallShutdown(t *testing.T) {
	cfg := DefaultConfig()
	cfg.StallWarning = 100 * time.Millisecond
	cfg.StallShutdown = 300 * time.Millisecond
	c := newCluster(t, 2, cfg)
	buf := f32(1)
	err := c.engines[0].Enqueue(allreduceReq("never", 1), buf, buf).Wait(waitCtx(t))
	if err == nil || !strings.Contains(err.Error(), "rank 1") || !strings.Contains(err.Error(), "never") {
		t.Fatalf("err = %v, want a stall error naming rank 1", err)
	}
	if errors.Is(err, ErrMismatch) {
		t.Errorf("a stalled op's error %v matches ErrMismatch", err)
	}
}

func TestJoinContributesNothing(t *testing.T) {
	const n = 3
	c := newCluster(t, n, DefaultConfig())
	ctx := waitCtx(t)
	jh := c.engines[0].Enqueue(negotiate.Request{Name: "join", Kind: negotiate.Join}, nil, nil)
	var wg sync.WaitGroup
	for r := 1; r < n; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := f32(float32(r))
			if err := c.engines[r].Enqueue(allreduceReq("g", 1), buf, buf).Wait(ctx); err != nil {
				t.Error(err)
				return
			}
			if got := getF32(buf)[0]; got != 3 { // 1 + 2; the joined rank adds nothing
				t.Errorf("rank %d: got %v, want 3", r, got)
			}
			if err := c.engines[r].Enqueue(negotiate.Request{Name: "join", Kind: negotiate.Join}, nil, nil).Wait(ctx); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if err := jh.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if last := jh.JoinLast(); last != 1 && last != 2 {
		t.Errorf("last joined = %d", last)
	}
}

// Tensors of at least unfusedBytes are reduced in place beside the fused small ones: values,
// scaling and a joined rank's (absent) contribution come out as if everything were fused.
func TestAllreduceLargeTensorsBesideFused(t *testing.T) {
	sizes := []int{3, 300_000, 5, unfusedBytes / 4, unfusedBytes/4 - 1} // float32 elements
	for _, tc := range []struct {
		name   string
		joined bool // rank 0 joins instead of submitting
	}{{"average with pre- and postscale", false}, {"sum with a joined rank", true}} {
		t.Run(tc.name, func(t *testing.T) {
			const n = 3
			c := newCluster(t, n, DefaultConfig())
			ctx := waitCtx(t)
			var jh *Handle
			if tc.joined {
				jh = c.engines[0].Enqueue(negotiate.Request{Name: "join", Kind: negotiate.Join}, nil, nil)
			}
			var wg sync.WaitGroup
			for r := range n {
				if tc.joined && r == 0 {
					continue
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					bufs := make([][]byte, len(sizes))
					hs := make([]*Handle, len(sizes))
					for i, k := range sizes {
						vals := make([]float32, k)
						for j := range vals {
							vals[j] = float32(r+1) * float32(j%7+1)
						}
						bufs[i] = f32(vals...)
						req := allreduceReq(fmt.Sprintf("t%d", i), k)
						if !tc.joined {
							req.Average, req.PreScale, req.PostScale = true, 2, 0.5
						}
						hs[i] = c.engines[r].Enqueue(req, bufs[i], bufs[i])
					}
					for i, h := range hs {
						if err := h.Wait(ctx); err != nil {
							t.Errorf("rank %d, tensor %d: %v", r, i, err)
							return
						}
						got := getF32(bufs[i])
						for j, v := range got {
							// Rank r sends (r+1)x: prescaled by 2, averaged and halved, 1x+2x+3x gives 2x;
							// summed without rank 0 (joined), 2x+3x.
							want := float32(2 * (j%7 + 1))
							if tc.joined {
								want = float32(5 * (j%7 + 1))
							}
							if v != want {
								t.Errorf("rank %d, tensor %d (%d elements), element %d: got %v, want %v", r, i, sizes[i], j, v, want)
								return
							}
						}
					}
					if tc.joined {
						if err := c.engines[r].Enqueue(negotiate.Request{Name: "join", Kind: negotiate.Join}, nil, nil).Wait(ctx); err != nil {
							t.Error(err)
						}
					}
				}()
			}
			wg.Wait()
			if jh != nil {
				if err := jh.Wait(ctx); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// Abort (a rank's program failed outside kolo) fails this rank's pending and later ops and every
// peer's waiting ones, all with the aborting rank's reason.
func TestAbortTellsPeersWhy(t *testing.T) {
	const n = 3
	c := newCluster(t, n, DefaultConfig())
	ctx := waitCtx(t)
	reason := "rank 0 raised ValueError: bad batch at step 2"
	mine := c.engines[0].Enqueue(allreduceReq("other", 1), f32(1), f32(0)) // pending: no peer submits "other"
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for r := 1; r < n; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := f32(1)
			errs <- c.engines[r].Enqueue(allreduceReq("g", 1), buf, buf).Wait(ctx)
		}()
	}
	time.Sleep(50 * time.Millisecond) // let the peers block in negotiation
	start := time.Now()
	c.engines[0].Abort(errors.New(reason))
	wg.Wait()
	close(errs)
	for err := range errs {
		if err == nil || !strings.Contains(err.Error(), reason) {
			t.Errorf("peer's op: err = %v, want one carrying %q", err, reason)
		}
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("peers failed %v after the abort", took)
	}
	if err := mine.Wait(ctx); err == nil || !strings.Contains(err.Error(), reason) {
		t.Errorf("aborting rank's pending op: err = %v", err)
	}
	buf := f32(1)
	if err := c.engines[0].Enqueue(allreduceReq("later", 1), buf, buf).Wait(ctx); err == nil || !strings.Contains(err.Error(), reason) {
		t.Errorf("aborting rank's later op: err = %v", err)
	}
	c.engines[0].Abort(errors.New("a second abort changes nothing"))
	if err := c.engines[0].Err(); err == nil || !strings.Contains(err.Error(), reason) {
		t.Errorf("Err() = %v after a second Abort", err)
	}
}

// brokenComm negotiates normally (the Messenger is separate) but fails every data transfer, as a
// transport does whose peer died between negotiation and the collective.
type brokenComm struct{ transport.Comm }

func (b brokenComm) Send(ctx context.Context, peer int, p []byte) error {
	return &transport.PeerError{Rank: peer, Op: "send", Err: errors.New("injected: connection reset")}
}

func (b brokenComm) Recv(ctx context.Context, peer int, p []byte) error {
	return &transport.PeerError{Rank: peer, Op: "recv", Err: errors.New("injected: connection reset")}
}

func (b brokenComm) SendRecv(ctx context.Context, to int, sb []byte, from int, rb []byte) error {
	return &transport.PeerError{Rank: to, Op: "sendrecv", Err: errors.New("injected: connection reset")}
}

// A collective that fails after negotiation fails the handles of the ops it was running (they are
// no longer pending anywhere), instead of leaving their callers waiting forever.
func TestCollectiveFailureFailsItsOwnHandles(t *testing.T) {
	const n = 2
	c := newClusterWith(t, n, DefaultConfig(), []inmem.Option{inmem.WithoutShared()}, func(r int, ep *inmem.Endpoint, g *Group) {
		if r == 0 {
			g.Comm, g.Local = brokenComm{ep.Comm()}, brokenComm{ep.Comm()}
		}
	})
	ctx := waitCtx(t)
	peer := make(chan error, 1)
	go func() {
		buf := f32(1, 2, 3)
		peer <- c.engines[1].Enqueue(allreduceReq("g", 3), buf, buf).Wait(ctx)
	}()
	buf := f32(1, 2, 3)
	err := c.engines[0].Enqueue(allreduceReq("g", 3), buf, buf).Wait(ctx)
	if err == nil || !strings.Contains(err.Error(), "injected") {
		t.Fatalf("rank 0: err = %v, want the collective's failure", err)
	}
	// Rank 1 is inside the same collective, blocked on rank 0, which would now exit: its own
	// in-flight op must fail too once rank 0's transport goes, not wait forever.
	c.eps[0].Close()
	select {
	case err := <-peer:
		if err == nil {
			t.Fatal("rank 1's op succeeded")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("rank 1's op still waits 5 s after rank 0 went")
	}
}
