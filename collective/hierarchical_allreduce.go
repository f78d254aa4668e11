package collective

import (
	"context"
	"fmt"

	"github.com/kolo-dl/kolo/dtype"
	"github.com/kolo-dl/kolo/reduce"
	"github.com/kolo-dl/kolo/transport"
)

// HierarchicalAllreduce reduces buf in place across hosts in three phases: a reduce-scatter among
// the ranks of this host (local), after which local rank i holds the host's sum of slice i; an
// allreduce of that slice among the ranks with local rank i on every host (cross); and an
// allgather of the slices on each host. Only 1/local.Size() of buf crosses the network per rank.
//
// When local implements transport.Shared the local phases run in shared memory, chunked by slot
// size, and the cross allreduce works directly on the slot. Otherwise they are ring phases over
// local.
//
// Precondition: every host has the same number of local ranks, and local/cross ranks are numbered
// consistently (cross-rank peers have the same local rank), so that slice i is the same bytes
// everywhere. All ranks end bitwise identical: each slice is reduced by the cross allreduce of the
// slice's owners (itself bitwise consistent) and then only copied.
func HierarchicalAllreduce(ctx context.Context, local, cross transport.Comm, buf []byte, t dtype.DType, op reduce.Op, tun *Tuning) error {
	if err := checkReduce("hierarchical allreduce", buf, t, op); err != nil {
		return err
	}
	if len(buf) == 0 {
		return nil
	}
	if local.Size() == 1 {
		return Allreduce(ctx, cross, buf, t, op, tun)
	}
	if s, ok := sharedOf(local, t.Size()); ok && !tun.noShared() {
		return hierarchicalShared(ctx, local, s, cross, buf, t, op, tun)
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
	if err := Allreduce(ctx, cross, buf[bounds[r]:bounds[r+1]], t, op, tun); err != nil {
		return fmt.Errorf("hierarchical allreduce: cross-host allreduce of local slice %d: %w", r, err)
	}
	return ringAllgather(ctx, local, "hierarchical allreduce: local", buf, bounds)
}

// hierarchicalShared is SharedAllreduce with a cross-host allreduce of each rank's reduced slice
// between the reduce and the copy-out.
func hierarchicalShared(ctx context.Context, local transport.Comm, s transport.Shared, cross transport.Comm,
	buf []byte, t dtype.DType, op reduce.Op, tun *Tuning) error {
	n, r := local.Size(), local.Rank()
	es := t.Size()
	mine := s.Slot(r)
	chunkMax := len(mine) / es * es
	ws := getWorkspace(0, n)
	defer putWorkspace(ws)
	srcs := ws.srcs

	for off := 0; off < len(buf); off += chunkMax {
		chunk := buf[off:min(off+chunkMax, len(buf))]
		// Stage what the other ranks reduce, streamed because another core reads it (see
		// reduce.StreamCopy); this rank's own slice is read from chunk.
		lo, hi := part(len(chunk), es, n, r)
		reduce.StreamCopy(mine[:lo], chunk[:lo])
		reduce.StreamCopy(mine[hi:len(chunk)], chunk[hi:])
		if err := s.Barrier(ctx); err != nil {
			return fmt.Errorf("hierarchical allreduce: bytes [%d,%d): local barrier after copy-in: %w", off, off+len(chunk), err)
		}
		for q := range n {
			srcs[q] = s.Slot(q)[lo:hi]
		}
		srcs[r] = chunk[lo:hi]
		reduce.Many(t, op, mine[lo:hi], srcs...)
		// No barrier needed before the cross phase: it touches only this rank's own slice.
		if err := Allreduce(ctx, cross, mine[lo:hi], t, op, tun); err != nil {
			return fmt.Errorf("hierarchical allreduce: bytes [%d,%d): cross-host allreduce of local slice %d: %w",
				off, off+len(chunk), r, err)
		}
		if err := s.Barrier(ctx); err != nil {
			return fmt.Errorf("hierarchical allreduce: bytes [%d,%d): local barrier after cross-host phase: %w", off, off+len(chunk), err)
		}
		for q := range n {
			lo, hi := part(len(chunk), es, n, q)
			copy(chunk[lo:hi], s.Slot(q)[lo:hi])
		}
		if err := s.Barrier(ctx); err != nil {
			return fmt.Errorf("hierarchical allreduce: bytes [%d,%d): local barrier after copy-out: %w", off, off+len(chunk), err)
		}
	}
	return nil
}
