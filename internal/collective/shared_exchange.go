package collective

import (
	"context"
	"encoding/binary"
	"fmt"

	"github.com/kolo-dl/kolo/internal/dtype"
	"github.com/kolo-dl/kolo/internal/reduce"
	"github.com/kolo-dl/kolo/internal/transport"
)

// The shared-memory forms of allgather, broadcast, reduce-scatter and alltoall. Over per-pair rings
// these move every byte through a ring (written once, read once) in n-1 steps of pairwise
// hand-offs (a ring allgather, a chain broadcast, a pairwise alltoall), and an alltoall reserves
// every pair's ring: n² of /dev/shm, however large the segment's slots. Through the slots, which
// the segment has anyway (one per rank), a byte is written once into its sender's slot and read
// once by each rank that needs it, every rank at once, with one barrier per piece, and nothing is
// reserved beyond the slots.
//
// Each rank's slot is used as two halves, so that pieces pipeline: at step k every rank writes
// piece k into half k%2 of its own slot and reads piece k-1 from the other half of the others'
// slots, and then all pass one barrier. A half is rewritten two steps after it was written, after
// the barrier that ended its readers' step. A last barrier after the last reads keeps the next
// collective, which writes the slots again from the start, off them. K pieces cost K+1 barriers.

// halfBytes is the length of each of a slot's two halves: a multiple of 64 bytes, so that pieces
// start on cache lines.
func halfBytes(s transport.Shared, r int) int { return len(s.Slot(r)) / 2 &^ 63 }

// slotHalf is half k%2 of rank q's slot.
func slotHalf(s transport.Shared, q, k int) []byte {
	h := halfBytes(s, q)
	off := (k % 2) * h
	return s.Slot(q)[off : off+h : off+h]
}

// pieceBytes is how many bytes a rank moves per piece, from a half of h bytes: every rank computes
// the same value, since every slot has one length, Oversubscribed is the group's and the tuning
// the same everywhere. When every rank has a CPU a piece is the shared allreduce's round (tun's
// SharedRoundBytes), small enough to still be in cache when its readers copy it; with more ranks
// than CPUs each barrier costs sleeps and wake-ups, and pieces are as large as half a slot.
func pieceBytes(s transport.Shared, h int, tun *Tuning) int {
	if s.Oversubscribed() {
		return h
	}
	return min(h, tun.sharedRound())
}

// slotPipeline runs the steps. write(k) writes this rank's piece k into slotHalf(s, rank, k);
// read(k) reads piece k from the others' halves (slotHalf(s, q, k)); more(k), called after the
// barrier that published piece k, says whether there is a piece k+1, and must answer alike on
// every rank. A read that fails (bytes that do not fit what this rank expects) does not leave the
// pipeline, which would hold the others at their next barrier until the progress timeout: the
// rank steps on with the others and returns the first such error at the end.
func slotPipeline(ctx context.Context, s transport.Shared, what string,
	write func(k int), read func(k int) error, more func(k int) bool) error {
	var readErr error
	last := false
	for k := 0; ; k++ {
		if !last {
			write(k)
		}
		if k > 0 {
			if err := read(k - 1); err != nil && readErr == nil {
				readErr = err
			}
		}
		if err := s.Barrier(ctx); err != nil {
			return fmt.Errorf("%s: barrier after piece %d: %w", what, k, err)
		}
		if last {
			return readErr
		}
		last = !more(k)
	}
}

// pieceRange is the part of a block [lo,hi) that piece k of p bytes a piece covers; empty past the
// block's end.
func pieceRange(lo, hi, k, p int) (int, int) {
	a := min(lo+k*p, hi)
	return a, min(a+p, hi)
}

// largestBlock is the longest of the blocks that bounds (n+1 offsets) delimit.
func largestBlock(bounds []int) int {
	largest := 0
	for q := range len(bounds) - 1 {
		largest = max(largest, bounds[q+1]-bounds[q])
	}
	return largest
}

// sharedAllgather is Allgather through the slots: piece k of every rank's block (recv's own block
// already holds send) goes through its owner's slot to every other rank.
func sharedAllgather(ctx context.Context, c transport.Comm, s transport.Shared, recv []byte, bounds []int, tun *Tuning) error {
	n, r := c.Size(), c.Rank()
	largest := largestBlock(bounds)
	if largest == 0 {
		return nil
	}
	stores, err := slotStores(ctx, c, s, tun)
	if err != nil {
		return fmt.Errorf("shared allgather: %w", err)
	}
	p := pieceBytes(s, halfBytes(s, r), tun)
	return slotPipeline(ctx, s, "shared allgather",
		func(k int) {
			lo, hi := pieceRange(bounds[r], bounds[r+1], k, p)
			slotCopy(stores, slotHalf(s, r, k)[:hi-lo], recv[lo:hi])
		},
		func(k int) error {
			for q := range n {
				if q != r {
					lo, hi := pieceRange(bounds[q], bounds[q+1], k, p)
					copy(recv[lo:hi], slotHalf(s, q, k))
				}
			}
			return nil
		},
		func(k int) bool { return (k+1)*p < largest })
}

// sharedBroadcast is Broadcast through root's slot: root writes each piece once and every other
// rank copies it out, all at once, while root writes the next.
func sharedBroadcast(ctx context.Context, c transport.Comm, s transport.Shared, buf []byte, root int, tun *Tuning) error {
	r := c.Rank()
	stores, err := slotStores(ctx, c, s, tun)
	if err != nil {
		return fmt.Errorf("shared broadcast from rank %d: %w", root, err)
	}
	p := pieceBytes(s, halfBytes(s, root), tun)
	err = slotPipeline(ctx, s, "shared broadcast",
		func(k int) {
			if r == root {
				lo, hi := pieceRange(0, len(buf), k, p)
				slotCopy(stores, slotHalf(s, r, k)[:hi-lo], buf[lo:hi])
			}
		},
		func(k int) error {
			if r != root {
				lo, hi := pieceRange(0, len(buf), k, p)
				copy(buf[lo:hi], slotHalf(s, root, k))
			}
			return nil
		},
		func(k int) bool { return (k+1)*p < len(buf) })
	if err != nil {
		return fmt.Errorf("broadcast from rank %d: %w", root, err) // formatted here: no string per op
	}
	return nil
}

// sharedReduceScatter is ReduceScatter through the slots: each half holds one region per rank,
// and at piece k every rank writes there piece k of every other rank's block of send; each rank
// then reduces its own piece from its own send and the others' regions, in rank order, straight
// into recv. send is only read, so no copy of it is made.
func sharedReduceScatter(ctx context.Context, c transport.Comm, s transport.Shared, send, recv []byte, counts []int,
	t dtype.DType, op reduce.Op, tun *Tuning) error {
	n, r := c.Size(), c.Rank()
	ws := getWorkspace(0, n)
	defer putWorkspace(ws)
	srcs, bounds := ws.srcs, append(ws.bounds[:0], 0)
	for q, k := range counts {
		bounds = append(bounds, bounds[q]+k)
	}
	largest := largestBlock(bounds)
	if largest == 0 {
		return nil
	}
	stores, err := slotStores(ctx, c, s, tun)
	if err != nil {
		return fmt.Errorf("shared reduce-scatter: %w", err)
	}
	es := t.Size()
	p := pieceBytes(s, halfBytes(s, r)/n, tun) / (64 * es) * (64 * es) // whole elements, whole cache lines
	return slotPipeline(ctx, s, "shared reduce-scatter",
		func(k int) {
			half := slotHalf(s, r, k)
			for q := range n {
				if q != r {
					lo, hi := pieceRange(bounds[q], bounds[q+1], k, p)
					slotCopy(stores, half[q*p:q*p+hi-lo], send[lo:hi])
				}
			}
		},
		func(k int) error {
			lo, hi := pieceRange(bounds[r], bounds[r+1], k, p)
			if lo == hi {
				return nil
			}
			for q := range n {
				srcs[q] = slotHalf(s, q, k)[r*p : r*p+hi-lo]
			}
			srcs[r] = send[lo:hi]
			reduce.Many(t, op, recv[lo-bounds[r]:hi-bounds[r]], srcs...)
			return nil
		},
		func(k int) bool { return (k+1)*p < largest })
}

// sharedReduceScatterFits says whether s's halves hold one region of at least one piece per rank.
func sharedReduceScatterFits(s transport.Shared, n int, t dtype.DType) bool {
	return halfBytes(s, 0)/n >= 64*t.Size()
}

// Alltoall through the slots. A rank knows what it sends each rank and receives from each, not
// what others send each other, so no rank can compute how many pieces the largest block needs.
// Each half therefore starts with a header: a flag saying whether its writer has bytes left after
// this piece, and one entry per destination (the offset in the destination's block, the length, and
// where in the half the bytes are). The pipeline goes on while any rank's flag is up. The space
// after the header is shared among the destinations that still have bytes, evenly, the space one
// of them leaves going to the others, so a single large block gets the whole half.
const (
	a2aFlag  = 0  // byte: 1 when the writer has bytes left after this piece
	a2aTable = 64 // n entries of a2aEntry bytes
	a2aEntry = 16 // uint64 offset in the block, uint32 length, uint32 offset in the half
)

func a2aHeader(n int) int { return (a2aTable + n*a2aEntry + 63) &^ 63 }

// sharedAlltoallFits says whether a half leaves room for at least a cache line per destination
// after its header.
func sharedAlltoallFits(s transport.Shared, n int) bool {
	return halfBytes(s, 0)-a2aHeader(n) >= 64*n
}

// sharedAlltoall is Alltoall through the slots; recv's own block already holds this rank's part
// of send. soff and roff are the blocks' offsets (n+1 each).
func sharedAlltoall(ctx context.Context, c transport.Comm, s transport.Shared, send []byte, soff []int, recv []byte, roff []int, tun *Tuning) error {
	n, r := c.Size(), c.Rank()
	stores, err := slotStores(ctx, c, s, tun)
	if err != nil {
		return fmt.Errorf("shared alltoall: %w", err)
	}
	hdr := a2aHeader(n)
	space := pieceBytes(s, halfBytes(s, r), tun) - hdr
	if space < 64*n { // a piece too small for its header: the whole half
		space = halfBytes(s, r) - hdr
	}
	ws := getWorkspace(0, 3*n)
	defer putWorkspace(ws)
	// sent[q]: bytes of block q written so far; got[q]: bytes received from q; give[q]: this piece's.
	state := ws.bounds[:3*n]
	clear(state)
	sent, got, give := state[:n], state[n:2*n], state[2*n:]
	err = slotPipeline(ctx, s, "shared alltoall",
		func(k int) {
			half := slotHalf(s, r, k)
			// Share the space among the destinations with bytes left: an even share each, in
			// cache lines, then what the smaller blocks left over to the others in turn.
			active := 0
			for q := range n {
				give[q] = 0
				if q != r && sent[q] < soff[q+1]-soff[q] {
					active++
				}
			}
			free := space
			if active > 0 {
				share := max(space/active&^63, 64)
				for q := range n {
					if q != r {
						give[q] = min(soff[q+1]-soff[q]-sent[q], share, free&^63)
						free -= (give[q] + 63) &^ 63
					}
				}
				for i := 1; i < n && free >= 64; i++ {
					q := (r + i) % n
					if extra := min(soff[q+1]-soff[q]-sent[q]-give[q], free&^63); extra > 0 && give[q]%64 == 0 {
						give[q] += extra
						free -= (extra + 63) &^ 63
					}
				}
			}
			left := false
			at := hdr
			for q := range n {
				e := half[a2aTable+q*a2aEntry:]
				binary.LittleEndian.PutUint64(e, uint64(sent[q]))
				binary.LittleEndian.PutUint32(e[8:], uint32(give[q]))
				binary.LittleEndian.PutUint32(e[12:], uint32(at))
				if give[q] > 0 {
					lo := soff[q] + sent[q]
					slotCopy(stores, half[at:at+give[q]], send[lo:lo+give[q]])
					sent[q] += give[q]
					at += (give[q] + 63) &^ 63
				}
				if q != r && sent[q] < soff[q+1]-soff[q] {
					left = true
				}
			}
			half[a2aFlag] = 0
			if left {
				half[a2aFlag] = 1
			}
		},
		func(k int) error {
			var bad error
			for q := range n {
				if q == r {
					continue
				}
				half := slotHalf(s, q, k)
				e := half[a2aTable+r*a2aEntry:]
				pos := int(binary.LittleEndian.Uint64(e))
				ln := int(binary.LittleEndian.Uint32(e[8:]))
				at := int(binary.LittleEndian.Uint32(e[12:]))
				if ln == 0 {
					continue
				}
				if pos != got[q] || pos+ln > roff[q+1]-roff[q] || at+ln > len(half) {
					if bad == nil {
						bad = fmt.Errorf("alltoall: rank %d sends more than the %d bytes this rank expects from it", q, roff[q+1]-roff[q])
					}
					continue
				}
				copy(recv[roff[q]+pos:roff[q]+pos+ln], half[at:at+ln])
				got[q] += ln
			}
			return bad
		},
		func(k int) bool {
			for q := range n {
				if slotHalf(s, q, k)[a2aFlag] != 0 {
					return true
				}
			}
			return false
		})
	if err != nil {
		return err
	}
	for q := range n {
		if q != r && got[q] != roff[q+1]-roff[q] {
			return fmt.Errorf("alltoall: rank %d sent %d bytes, this rank expects %d from it", q, got[q], roff[q+1]-roff[q])
		}
	}
	return nil
}
