package collective

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/dtype"
	"github.com/kolo-dl/kolo/internal/reduce"
	"github.com/kolo-dl/kolo/internal/transport"
	"github.com/kolo-dl/kolo/internal/transport/inmem"
)

var errDied = errors.New("rank died (test)")

// dyingComm kills its endpoint when the algorithm makes its killAt-th transport call, and fails
// that call: a rank dying in the middle of an op.
type dyingComm struct {
	transport.Comm
	ep     *inmem.Endpoint
	calls  int
	killAt int
}

func (d *dyingComm) tick() error {
	d.calls++
	if d.calls == d.killAt {
		d.ep.Kill(errDied)
		return errDied
	}
	return nil
}

func (d *dyingComm) Send(ctx context.Context, peer int, b []byte) error {
	if err := d.tick(); err != nil {
		return err
	}
	return d.Comm.Send(ctx, peer, b)
}

func (d *dyingComm) Recv(ctx context.Context, peer int, b []byte) error {
	if err := d.tick(); err != nil {
		return err
	}
	return d.Comm.Recv(ctx, peer, b)
}

func (d *dyingComm) SendRecv(ctx context.Context, to int, sb []byte, from int, rb []byte) error {
	if err := d.tick(); err != nil {
		return err
	}
	return d.Comm.SendRecv(ctx, to, sb, from, rb)
}

// dyingShared also counts barriers.
type dyingShared struct{ *dyingComm }

func (d dyingShared) Slot(r int) []byte    { return d.ep.Slot(r) }
func (d dyingShared) Oversubscribed() bool { return d.ep.Oversubscribed() }
func (d dyingShared) Memo() *atomic.Uint32 { return d.ep.Memo() }
func (d dyingShared) Barrier(ctx context.Context) error {
	if err := d.tick(); err != nil {
		return err
	}
	return d.ep.Barrier(ctx)
}

// Survivors of a rank killed mid-op fail with an error that wraps ErrPeerLost, names the dead
// rank, and says which algorithm failed. Each case's shape is one where every survivor's next
// step involves the dead rank (a ring of 3, the fold pair of a 3-rank recursive doubling, a shared
// barrier), so none can finish or hang.
func TestRankKilledMidOp(t *testing.T) {
	const elems = 3000
	for _, tc := range []struct {
		name   string
		n      int
		dead   int
		killAt []int
		opts   []inmem.Option
		run    allreduceFunc
	}{
		{"ring allreduce", 3, 1, []int{1, 2, 3, 4}, []inmem.Option{inmem.WithoutShared()}, RingAllreduce},
		{"ring allreduce", 2, 0, []int{1, 2}, []inmem.Option{inmem.WithoutShared()}, RingAllreduce},
		{"recursive doubling allreduce", 3, 1, []int{1, 2}, []inmem.Option{inmem.WithoutShared()}, RecursiveDoublingAllreduce},
		{"shared allreduce", 4, 2, []int{1, 2, 3, 5}, []inmem.Option{inmem.WithSlotBytes(4096)}, sharedRun},
		// The exchanges through the slots, with pieces small enough that a kill lands mid-pipeline:
		// in the group's slot-store measurement (the first ~30 barriers), in the first op's
		// pipeline, and in the second's.
		{"shared allgather", 4, 2, []int{1, 20, 30, 36, 40}, []inmem.Option{inmem.WithSlotBytes(1024)}, exchangeRun("allgather")},
		{"shared alltoall", 4, 1, []int{2, 33, 38, 45}, []inmem.Option{inmem.WithSlotBytes(2048)}, exchangeRun("alltoall")},
		{"shared reduce-scatter", 3, 0, []int{1, 33, 36, 41}, []inmem.Option{inmem.WithSlotBytes(2048)}, exchangeRun("reducescatter")},
		{"shared broadcast", 3, 2, []int{3, 34, 40, 60}, []inmem.Option{inmem.WithSlotBytes(64 << 10)}, exchangeRun("broadcast")},
	} {
		for _, killAt := range tc.killAt {
			t.Run(fmt.Sprintf("%s/n=%d/call=%d", tc.name, tc.n, killAt), func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
				defer cancel()
				eps := inmem.New(tc.n, tc.opts...)
				errs := make([]error, tc.n)
				var wg sync.WaitGroup
				for r, e := range eps {
					var c transport.Comm = e.Comm()
					if r == tc.dead {
						d := &dyingComm{Comm: c, ep: e, killAt: killAt}
						c = d
						if _, ok := e.Comm().(transport.Shared); ok {
							c = dyingShared{d}
						}
					}
					wg.Go(func() {
						buf := make([]byte, 4*elems)
						// Two ops, so kill points beyond the first op's calls land in the second.
						for range 2 {
							if errs[r] = tc.run(ctx, c, buf, dtype.Float32, reduce.Sum); errs[r] != nil {
								return
							}
						}
					})
				}
				wg.Wait()
				for r, err := range errs {
					if r == tc.dead {
						if !errors.Is(err, errDied) {
							t.Errorf("the dying rank returned %v", err)
						}
						continue
					}
					wantPeerLost(t, fmt.Sprintf("rank %d", r), err, tc.dead)
					if err != nil && !strings.Contains(err.Error(), tc.name) {
						t.Errorf("rank %d: error %q does not say it was the %s", r, err, tc.name)
					}
				}
			})
		}
	}
}

// A rank that never arrives leaves the others waiting until their ctx ends; then every one of
// them returns an error wrapping ctx's.
func TestContextCancelEndsCollectives(t *testing.T) {
	const n = 4
	buf := func() []byte { return make([]byte, 40_000) }
	for _, tc := range []struct {
		name   string
		shared bool
		run    func(ctx context.Context, c transport.Comm) error
	}{
		{"ring allreduce", false, func(ctx context.Context, c transport.Comm) error {
			return RingAllreduce(ctx, c, buf(), dtype.Float32, reduce.Sum)
		}},
		{"recursive doubling allreduce", false, func(ctx context.Context, c transport.Comm) error {
			return RecursiveDoublingAllreduce(ctx, c, buf(), dtype.Float32, reduce.Sum)
		}},
		{"shared allreduce", true, func(ctx context.Context, c transport.Comm) error {
			return sharedRun(ctx, c, buf(), dtype.Float32, reduce.Sum)
		}},
		{"barrier", false, func(ctx context.Context, c transport.Comm) error { return Barrier(ctx, c) }},
		{"shared barrier", true, func(ctx context.Context, c transport.Comm) error { return Barrier(ctx, c) }},
		{"allgather", false, func(ctx context.Context, c transport.Comm) error {
			return Allgather(ctx, c, make([]byte, 10), make([]byte, 10*n), []int{10, 10, 10, 10}, nil)
		}},
		{"broadcast", false, func(ctx context.Context, c transport.Comm) error {
			return Broadcast(ctx, c, buf(), n-1, nil)
		}},
		{"reduce-scatter", false, func(ctx context.Context, c transport.Comm) error {
			return ReduceScatter(ctx, c, make([]byte, 16*n), make([]byte, 16), []int{16, 16, 16, 16}, dtype.Int32, reduce.Max, nil)
		}},
		{"shared allgather", true, func(ctx context.Context, c transport.Comm) error {
			return exchangeRun("allgather")(ctx, c, buf(), dtype.Float32, reduce.Sum)
		}},
		{"shared alltoall", true, func(ctx context.Context, c transport.Comm) error {
			return exchangeRun("alltoall")(ctx, c, buf(), dtype.Float32, reduce.Sum)
		}},
		{"shared reduce-scatter", true, func(ctx context.Context, c transport.Comm) error {
			return exchangeRun("reducescatter")(ctx, c, buf(), dtype.Float32, reduce.Sum)
		}},
		{"shared broadcast", true, func(ctx context.Context, c transport.Comm) error {
			return exchangeRun("broadcast")(ctx, c, buf(), dtype.Float32, reduce.Sum)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var opts []inmem.Option
			if !tc.shared {
				opts = append(opts, inmem.WithoutShared())
			}
			eps := inmem.New(n, opts...)
			defer func() {
				for _, e := range eps {
					e.Close()
				}
			}()
			ctx, cancel := context.WithCancel(context.Background())
			errs := make([]error, n-1)
			var wg sync.WaitGroup
			for r := range n - 1 { // rank n-1 never calls
				wg.Go(func() { errs[r] = tc.run(ctx, eps[r].Comm()) })
			}
			time.Sleep(20 * time.Millisecond)
			cancel()
			wg.Wait()
			for r, err := range errs {
				if !errors.Is(err, context.Canceled) {
					t.Errorf("rank %d: got %v, want an error wrapping context.Canceled", r, err)
				}
			}
		})
	}
}

// exchangeRun adapts allgather, alltoall, reduce-scatter and broadcast to allreduceFunc's shape, so
// that the failure tests run them alike: buf is cut into one block per rank (a broadcast sends a
// buffer large enough to take the slots, from the last rank).
func exchangeRun(op string) allreduceFunc {
	return func(ctx context.Context, c transport.Comm, buf []byte, t dtype.DType, rop reduce.Op) error {
		n, r := c.Size(), c.Rank()
		each := len(buf) / n / t.Size() * t.Size()
		counts := slices.Repeat([]int{each}, n)
		switch op {
		case "allgather":
			return Allgather(ctx, c, buf[r*each:(r+1)*each], buf[:n*each], counts, nil)
		case "alltoall":
			return Alltoall(ctx, c, buf[:n*each], counts, make([]byte, n*each), counts, nil)
		case "reducescatter":
			return ReduceScatter(ctx, c, buf[:n*each], make([]byte, each), counts, t, rop, nil)
		}
		return Broadcast(ctx, c, make([]byte, sharedBroadcastBytes), n-1, nil)
	}
}
