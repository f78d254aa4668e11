package collective

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/kolo-dl/kolo/internal/dtype"
	"github.com/kolo-dl/kolo/internal/reduce"
	"github.com/kolo-dl/kolo/internal/transport"
	"github.com/kolo-dl/kolo/internal/transport/inmem"
)

// Over shared memory among more than two ranks, allgather, broadcast (from 1 MiB), alltoall and
// reduce-scatter move nothing through the pair rings (so an alltoall reserves none of them): they
// pass over a group whose rings fail.
func TestSharedExchangesUseNoRings(t *testing.T) {
	slotsOf := func(e *inmem.Endpoint) transport.Comm {
		var c transport.Comm = e
		return slotsOnly{Comm: c, Shared: c.(transport.Shared)}
	}
	for _, n := range []int{3, 8} { // two ranks use their pair rings, but for reduce-scatter
		for _, slot := range []int{16 << 10, 1 << 20} {
			t.Run(fmt.Sprintf("n=%d/slot=%d", n, slot), func(t *testing.T) {
				const block = 40_000 // several pieces in the small slots
				mustRanks(t, n, []inmem.Option{inmem.WithSlotBytes(slot)}, slotsOf, func(ctx context.Context, r int, c transport.Comm) error {
					counts := slices.Repeat([]int{block}, n)
					send := bytes.Repeat([]byte{byte(r + 1)}, block)
					recv := make([]byte, n*block)
					if err := Allgather(ctx, c, send, recv, counts, nil); err != nil {
						return fmt.Errorf("allgather: %w", err)
					}
					for q := range n {
						if recv[q*block] != byte(q+1) || recv[(q+1)*block-1] != byte(q+1) {
							return fmt.Errorf("allgather: block %d wrong", q)
						}
					}
					buf := make([]byte, sharedBroadcastBytes+3*block)
					if r == n-1 {
						copy(buf, bytes.Repeat([]byte{7}, len(buf)))
					}
					if err := Broadcast(ctx, c, buf, n-1, nil); err != nil {
						return fmt.Errorf("broadcast: %w", err)
					}
					if buf[0] != 7 || buf[len(buf)-1] != 7 {
						return fmt.Errorf("broadcast: wrong bytes")
					}
					a2aSend := bytes.Repeat([]byte{byte(r + 1)}, n*block)
					if err := Alltoall(ctx, c, a2aSend, counts, recv, counts, nil); err != nil {
						return fmt.Errorf("alltoall: %w", err)
					}
					for q := range n {
						if recv[q*block] != byte(q+1) || recv[(q+1)*block-1] != byte(q+1) {
							return fmt.Errorf("alltoall: block from %d wrong", q)
						}
					}
					rs := make([]byte, block)
					in := make([]byte, n*block)
					for i := 0; i < len(in); i += 4 {
						in[i] = 1 // int32 1 everywhere
					}
					if err := ReduceScatter(ctx, c, in, rs, counts, dtype.Int32, reduce.Sum, nil); err != nil {
						return fmt.Errorf("reduce-scatter: %w", err)
					}
					if rs[0] != byte(n) || rs[block-4] != byte(n) {
						return fmt.Errorf("reduce-scatter: got %d, want %d", rs[0], n)
					}
					return nil
				})
			})
		}
	}
}

// One rank's large block to one peer, every other block empty: the whole half goes to it, and the
// pipeline runs as long as that one block needs, on every rank.
func TestSharedAlltoallSkewed(t *testing.T) {
	const n, big = 4, 300_001
	rng := rand.New(rand.NewPCG(4, 23))
	payload := randomBytes(rng, big)
	for _, opts := range [][]inmem.Option{{inmem.WithSlotBytes(16 << 10)}, {inmem.WithSlotBytes(16 << 10), inmem.WithOversubscribed()}, nil} {
		recvs := make([][]byte, n)
		mustRanks(t, n, opts, nil, func(ctx context.Context, r int, c transport.Comm) error {
			sendCounts, recvCounts := make([]int, n), make([]int, n)
			var send []byte
			if r == 1 {
				sendCounts[2] = big
				send = payload
			}
			if r == 2 {
				recvCounts[1] = big
			}
			recvs[r] = make([]byte, sum(recvCounts))
			return Alltoall(ctx, c, send, sendCounts, recvs[r], recvCounts, nil)
		})
		if !bytes.Equal(recvs[2], payload) {
			t.Errorf("rank 2 did not receive rank 1's %d bytes intact", big)
		}
	}
}

// Counts that disagree between ranks (which the engine's negotiation rules out) fail the rank that
// expected otherwise with a message, and hang nobody: every rank steps through to the end.
func TestSharedAlltoallMismatchedCountsFail(t *testing.T) {
	const n = 3
	for _, tc := range []struct {
		name string
		sent int // rank 0 to rank 1
		want string
	}{
		{"more than expected", 100_000, "sends more than the 50000 bytes"},
		{"fewer than expected", 20_000, "sent 20000 bytes, this rank expects 50000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs := ranks(t, n, []inmem.Option{inmem.WithSlotBytes(16 << 10)}, nil, func(ctx context.Context, r int, c transport.Comm) error {
				sendCounts, recvCounts := make([]int, n), make([]int, n)
				if r == 0 {
					sendCounts[1] = tc.sent
				}
				if r == 1 {
					recvCounts[0] = 50_000
				}
				// Only rank 1's error is expected; the others must finish cleanly, not hang.
				err := Alltoall(ctx, c, make([]byte, sum(sendCounts)), sendCounts, make([]byte, sum(recvCounts)), recvCounts, nil)
				if r != 1 {
					return err
				}
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					return fmt.Errorf("rank 1 got %v, want an error containing %q", err, tc.want)
				}
				return nil
			})
			for r, err := range errs {
				if err != nil {
					t.Errorf("rank %d: %v", r, err)
				}
			}
		})
	}
}

// Repeating an exchange through the slots allocates nothing once the group's store measurement
// and the scratch pool are warm.
func TestSharedExchangesAllocateNothing(t *testing.T) {
	const n, size = 4, 300_000 // several pieces; a broadcast of n*size takes the slots
	for _, op := range []string{"allgather", "broadcast", "alltoall", "reducescatter"} {
		t.Run(op, func(t *testing.T) {
			ins, outs := make([][]byte, n), make([][]byte, n)
			for r := range n {
				ins[r], outs[r] = make([]byte, n*size), make([]byte, n*size)
			}
			counts := slices.Repeat([]int{size}, n)
			l := newRankLoop(n, []inmem.Option{inmem.WithSlotBytes(64 << 10)}, func(ctx context.Context, r int, c transport.Comm) error {
				switch op {
				case "allgather":
					return Allgather(ctx, c, ins[r][:size], outs[r], counts, nil)
				case "broadcast":
					return Broadcast(ctx, c, ins[r], 0, nil)
				case "alltoall":
					return Alltoall(ctx, c, ins[r], counts, outs[r], counts, nil)
				}
				return ReduceScatter(ctx, c, ins[r], outs[r][:size], counts, dtype.Float32, reduce.Sum, nil)
			})
			defer l.stop()
			if err := l.run(); err != nil { // the store measurement, the pool
				t.Fatal(err)
			}
			l.mustNotAllocate(t)
		})
	}
}
