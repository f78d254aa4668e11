package collective

import (
	"context"
	"fmt"

	"github.com/kolo-dl/kolo/internal/dtype"
	"github.com/kolo-dl/kolo/internal/reduce"
	"github.com/kolo-dl/kolo/internal/transport"
)

// DefaultSharedRoundBytes is how much of the buffer SharedAllreduce moves per round of barriers when every
// rank has a CPU: small enough that a round's data is still in cache when the next phase reads it
// back, large enough that three barriers per round are noise. With more ranks than CPUs each
// barrier costs futex sleeps and wake-ups, so rounds are as large as the slot. On the 2-vCPU EPYC
// VM (bin/kolo bench allreduce, 5 runs each, busbw GB/s at 4 MiB / 64 MiB), 2 ranks: 8 MiB
// rounds 7.6-12.0 / 6.7-10.5, 2 MiB 9.6-12.2 / 9.2-9.9, 1 MiB 10.7-14.8 / 9.9-10.7, 512 KiB
// 10.0-13.0 / 9.6-10.8; 4 ranks at 64 MiB: 8 MiB rounds 23-26 ms, 1 MiB 33-36 ms.
const DefaultSharedRoundBytes = 1 << 20

// SharedAllreduce reduces buf in place across ranks that share memory (s is c's Shared
// capability). Per round of at most one slot: every rank copies into its own slot what the others
// reduce (all of its chunk but its own 1/n slice); Barrier; each rank reduces its slice across its
// own chunk and the n-1 other slots, in one pass into its own buffer, and copies the result into
// its slot; Barrier; every rank copies the other slices out of their owners' slots; Barrier, so
// no rank overwrites its slot while others still read it.
//
// Everything written to a slot is read by another core, so how it is written matters: streaming
// stores (reduce.StreamCopy) or plain ones, whichever the group measured faster (SlotStores).
//
// Each slice is reduced by exactly one rank and then only copied, so every rank ends with the same
// bits. Memory traffic per rank is about 4x the buffer, with no data through Send/Recv at all.
func SharedAllreduce(ctx context.Context, c transport.Comm, s transport.Shared, buf []byte, t dtype.DType, op reduce.Op) error {
	if err := checkReduce("shared allreduce", buf, t, op); err != nil {
		return err
	}
	return sharedAllreduce(ctx, c, s, buf, t, op, 1, nil)
}

// sharedAllreduce is SharedAllreduce that also scales the result (AllreduceScaled): each rank
// scales the slice it reduced before publishing it, so every rank still ends with the same bits.
func sharedAllreduce(ctx context.Context, c transport.Comm, s transport.Shared, buf []byte, t dtype.DType, op reduce.Op, scale float64, tun *Tuning) error {
	return sharedRounds(ctx, "shared allreduce", c, s, nil, buf, t, op, scale, tun)
}

// sharedRounds runs SharedAllreduce's rounds. With a cross Comm (HierarchicalAllreduce), each
// rank's reduced slice is allreduced across hosts, among the ranks that own the same slice there,
// before it is published; rounds are then as large as the slot, since each one costs a network
// allreduce. The scaling is applied once per slice, by its owner (or owners, alike, in the cross
// allreduce), so every rank ends with the same bits.
func sharedRounds(ctx context.Context, what string, c transport.Comm, s transport.Shared, cross transport.Comm,
	buf []byte, t dtype.DType, op reduce.Op, scale float64, tun *Tuning) error {
	n, r := c.Size(), c.Rank()
	if n == 1 || len(buf) == 0 {
		if cross != nil {
			return AllreduceScaled(ctx, cross, buf, t, op, scale, tun)
		}
		if scale != 1 {
			reduce.Scale(t, buf, scale)
		}
		return nil
	}
	stores, err := slotStores(ctx, c, s, tun)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	es := t.Size()
	mine := s.Slot(r)
	chunkMax := len(mine) / es * es
	if cross == nil && !s.Oversubscribed() {
		chunkMax = min(chunkMax, tun.sharedRound()/es*es)
	}
	if chunkMax == 0 {
		return fmt.Errorf("%s: %d-byte slot cannot hold one %v element", what, len(mine), t)
	}
	ws := getWorkspace(0, n)
	defer putWorkspace(ws)
	srcs := ws.srcs

	for off := 0; off < len(buf); off += chunkMax {
		chunk := buf[off:min(off+chunkMax, len(buf))]
		// Stage only what the other ranks reduce: this rank's own slice is read from chunk.
		lo, hi := part(len(chunk), es, n, r)
		slotCopy(stores, mine[:lo], chunk[:lo])
		slotCopy(stores, mine[hi:len(chunk)], chunk[hi:])
		if err := s.Barrier(ctx); err != nil {
			return fmt.Errorf("%s: bytes [%d,%d): barrier after copy-in: %w", what, off, off+len(chunk), err)
		}
		for q := range n {
			srcs[q] = s.Slot(q)[lo:hi]
		}
		srcs[r] = chunk[lo:hi]
		reduce.Many(t, op, chunk[lo:hi], srcs...)
		switch {
		case cross != nil:
			// No barrier needed before the cross phase: it touches only this rank's own slice.
			if err := AllreduceScaled(ctx, cross, chunk[lo:hi], t, op, scale, tun); err != nil {
				return fmt.Errorf("%s: bytes [%d,%d): cross-host allreduce of local slice %d: %w",
					what, off, off+len(chunk), r, err)
			}
		case scale != 1:
			reduce.Scale(t, chunk[lo:hi], scale)
		}
		slotCopy(stores, mine[lo:hi], chunk[lo:hi])
		if err := s.Barrier(ctx); err != nil {
			return fmt.Errorf("%s: bytes [%d,%d): barrier after reducing: %w", what, off, off+len(chunk), err)
		}
		for q := range n {
			if q != r {
				lo, hi := part(len(chunk), es, n, q)
				copy(chunk[lo:hi], s.Slot(q)[lo:hi])
			}
		}
		if err := s.Barrier(ctx); err != nil {
			return fmt.Errorf("%s: bytes [%d,%d): barrier after copy-out: %w", what, off, off+len(chunk), err)
		}
	}
	return nil
}
