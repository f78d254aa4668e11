// Package collective holds kolo's collective algorithms (allreduce, allgather, broadcast, alltoall,
// reduce-scatter, barrier), each written top to bottom over the small transport.Comm interface, one
// algorithm per file, in the manner of Gloo.
//
// Every function is collective: all ranks of the Comm call it with consistent arguments (the same
// lengths, counts, dtype, op, root and Tuning), and every allreduce leaves bitwise-identical bytes on
// every rank, because data-parallel replicas that drift apart by one rounding never meet again.
// Lengths, counts and offsets are in bytes; reductions cut buffers only at element boundaries.
// Scratch memory comes from a small package-level pool (workspace.go), so repeated ops of one size
// do not allocate.
//
// The package must not open connections, name tensors, fuse, negotiate, or log: it moves and reduces
// the bytes it is handed, over the Comm it is handed, and says in its errors which step and which
// peer failed.
package collective

import (
	"context"
	"fmt"

	"github.com/kolo-dl/kolo/internal/dtype"
	"github.com/kolo-dl/kolo/internal/reduce"
	"github.com/kolo-dl/kolo/internal/transport"
)

// Tuning picks between algorithms. A nil *Tuning, or a zero field, means the default. Every rank
// must pass the same values, or ranks would run different algorithms and hang.
type Tuning struct {
	// SmallAllreduceBytes: buffers shorter than this use recursive doubling (log2 n latency
	// steps, each moving the whole buffer); longer ones use the ring (2(n-1) steps moving 1/n
	// each). Default DefaultSmallAllreduceBytes.
	SmallAllreduceBytes int
	// SmallBroadcastBytes: buffers shorter than this use a binomial tree; longer ones a pipelined
	// chain. Default DefaultSmallBroadcastBytes.
	SmallBroadcastBytes int
	// NoShared makes the collectives ignore a transport.Shared capability (Barrier excepted).
	NoShared bool
	// SlotStores is how the shared-memory algorithms write their slots; SlotStoresAuto (the
	// zero value) measures it per group (see SlotStores).
	SlotStores SlotStores
	// SlotStoresMeasured, if set, is called on rank 0 when a group has measured its slot stores
	// (SlotStoresAuto), with what the measurement found: the package does not log, its caller does.
	SlotStoresMeasured func(SlotStoresMeasurement)
	// SharedRoundBytes caps what the shared-memory algorithms move per rank per round of barriers
	// (the shared allreduce's round, the exchanges' piece) when every rank has a CPU; with more
	// ranks than CPUs a round is as large as the slot (half a slot for the exchanges). Default
	// DefaultSharedRoundBytes; less than MinSharedRoundBytes counts as that. Every rank of a group
	// must use the same value.
	SharedRoundBytes int
}

// Defaults for Tuning's zero fields; the engine's autotuner may override them per job.
//
// SmallAllreduceBytes: where recursive doubling (log2 n steps, each moving the whole buffer) stops
// beating the ring (2(n-1) steps moving 1/n each). Over inmem the two cross at a few tens of KiB;
// a link with a higher per-message cost moves the crossover up, by the cost model
// log2(n)(a+Sb) = 2(n-1)(a+Sb/n), to about 128 KiB for 4 ranks over TCP. 64 KiB sits between the
// two (docs/benchmarks.md, "The small-allreduce threshold", has the measurement).
//
// SmallBroadcastBytes: below it the chain's n-2 extra segment hops cost more than the tree's
// log2(n) whole-buffer hops save.
const (
	DefaultSmallAllreduceBytes = 64 << 10
	DefaultSmallBroadcastBytes = 64 << 10
)

func (tun *Tuning) smallAllreduce() int {
	if tun == nil || tun.SmallAllreduceBytes <= 0 {
		return DefaultSmallAllreduceBytes
	}
	return tun.SmallAllreduceBytes
}

func (tun *Tuning) smallBroadcast() int {
	if tun == nil || tun.SmallBroadcastBytes <= 0 {
		return DefaultSmallBroadcastBytes
	}
	return tun.SmallBroadcastBytes
}

func (tun *Tuning) sharedRound() int {
	if tun == nil || tun.SharedRoundBytes <= 0 {
		return DefaultSharedRoundBytes
	}
	return max(tun.SharedRoundBytes, MinSharedRoundBytes)
}

// MinSharedRoundBytes is the smallest round the shared-memory collectives take: a reduce-scatter
// piece is a whole number of cache lines of elements per rank, and a smaller round could hold none.
const MinSharedRoundBytes = 4 << 10

func (tun *Tuning) noShared() bool { return tun != nil && tun.NoShared }

// Allreduce reduces buf in place across all ranks of c with op, leaving the same bits on every
// rank. Small buffers use recursive doubling; large ones SharedAllreduce when c's ranks share
// memory, else the ring.
func Allreduce(ctx context.Context, c transport.Comm, buf []byte, t dtype.DType, op reduce.Op, tun *Tuning) error {
	return AllreduceScaled(ctx, c, buf, t, op, 1, tun)
}

// AllreduceScaled is Allreduce followed by reduce.Scale(t, buf, scale) (an average's division, a
// postscale factor), with the same result bits. Over shared memory the scaling is folded into the
// reduction: each slice is scaled by the rank that reduces it, while it is still in cache, which
// saves a whole pass over buf (for 23 MB of float32 gradients, ~0.7 ms per step).
func AllreduceScaled(ctx context.Context, c transport.Comm, buf []byte, t dtype.DType, op reduce.Op, scale float64, tun *Tuning) error {
	if err := checkReduce("allreduce", buf, t, op); err != nil {
		return err
	}
	if len(buf) == 0 {
		return nil
	}
	var err error
	switch {
	case c.Size() == 1:
	// Small buffers: one exchange per doubling step beats the shared-slot algorithm's three
	// barriers, even over shared memory.
	case len(buf) < tun.smallAllreduce():
		err = RecursiveDoublingAllreduce(ctx, c, buf, t, op)
	default:
		if s, ok := sharedOf(c, t.Size()); ok && !tun.noShared() {
			return sharedAllreduce(ctx, c, s, buf, t, op, scale, tun)
		}
		err = RingAllreduce(ctx, c, buf, t, op)
	}
	if err == nil && scale != 1 {
		reduce.Scale(t, buf, scale)
	}
	return err
}

// sharedOf returns c's shared capability when it has one with slots of at least minSlot bytes. A
// Shared whose slots are empty (a transport that has the methods but no segment) does not count.
// Every rank decides alike: all slots of a group have one length.
func sharedOf(c transport.Comm, minSlot int) (transport.Shared, bool) {
	s, ok := c.(transport.Shared)
	if !ok || len(s.Slot(c.Rank())) < max(minSlot, 1) {
		return nil, false
	}
	return s, true
}

// checkReduce validates the arguments every reduction shares.
func checkReduce(what string, buf []byte, t dtype.DType, op reduce.Op) error {
	if !t.Valid() {
		return fmt.Errorf("%s: invalid dtype %v", what, t)
	}
	if op < reduce.Sum || op > reduce.Prod {
		return fmt.Errorf("%s: invalid reduce op %d", what, uint8(op))
	}
	if len(buf)%t.Size() != 0 {
		return fmt.Errorf("%s: %d-byte buffer is not a whole number of %v elements (%d bytes each)",
			what, len(buf), t, t.Size())
	}
	return nil
}
