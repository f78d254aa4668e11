package collective

import (
	"context"
	"fmt"

	"github.com/kolo-dl/kolo/internal/dtype"
	"github.com/kolo-dl/kolo/internal/reduce"
	"github.com/kolo-dl/kolo/internal/transport"
)

// HierarchicalAllreduce reduces buf in place across hosts in three phases: a reduce-scatter among
// the ranks of this host (local), after which local rank i holds the host's sum of slice i; an
// allreduce of that slice among the ranks with local rank i on every host (cross); and an
// allgather of the slices on each host. Only 1/local.Size() of buf crosses the network per rank.
//
// When local implements transport.Shared the local phases are SharedAllreduce's, in rounds as
// large as the slot, with the cross allreduce of each round's slice between the reduce and the
// copy-out. Otherwise they are ring phases over local.
//
// Precondition: every host has the same number of local ranks, and local/cross ranks are numbered
// consistently (cross-rank peers have the same local rank), so that slice i is the same bytes
// everywhere. All ranks end bitwise identical: each slice is reduced by the cross allreduce of the
// slice's owners (itself bitwise consistent) and then only copied.
func HierarchicalAllreduce(ctx context.Context, local, cross transport.Comm, buf []byte, t dtype.DType, op reduce.Op, tun *Tuning) error {
	return HierarchicalAllreduceScaled(ctx, local, cross, buf, t, op, 1, tun)
}

// HierarchicalAllreduceScaled is HierarchicalAllreduce followed by reduce.Scale(t, buf, scale),
// with the same bits: the scaling is folded into the cross-host allreduce of each slice
// (AllreduceScaled), so it costs no pass over buf of its own.
func HierarchicalAllreduceScaled(ctx context.Context, local, cross transport.Comm, buf []byte, t dtype.DType, op reduce.Op, scale float64, tun *Tuning) error {
	if err := checkReduce("hierarchical allreduce", buf, t, op); err != nil {
		return err
	}
	if len(buf) == 0 {
		return nil
	}
	if local.Size() == 1 {
		return AllreduceScaled(ctx, cross, buf, t, op, scale, tun)
	}
	if s, ok := sharedOf(local, t.Size()); ok && !tun.noShared() {
		return sharedRounds(ctx, "hierarchical allreduce", local, s, cross, buf, t, op, scale, tun)
	}
	n := local.Size()
	lo, hi := part(len(buf), t.Size(), n, 0)
	ws := getWorkspace(min(hi-lo, segmentBytes), n)
	defer putWorkspace(ws)
	bounds := partition(ws.bounds, len(buf), t.Size(), n)
	if err := ringReduceScatter(ctx, local, "hierarchical allreduce: local", buf, bounds, t, op, ws.buf); err != nil {
		return err
	}
	r := local.Rank()
	if err := AllreduceScaled(ctx, cross, buf[bounds[r]:bounds[r+1]], t, op, scale, tun); err != nil {
		return fmt.Errorf("hierarchical allreduce: cross-host allreduce of local slice %d: %w", r, err)
	}
	return ringAllgather(ctx, local, "hierarchical allreduce: local", buf, bounds)
}
