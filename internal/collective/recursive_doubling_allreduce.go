package collective

import (
	"context"
	"fmt"

	"github.com/kolo-dl/kolo/internal/dtype"
	"github.com/kolo-dl/kolo/internal/reduce"
	"github.com/kolo-dl/kolo/internal/transport"
)

// RecursiveDoublingAllreduce reduces buf in place in log2(n) exchanges of the whole buffer: at
// step k each rank swaps its partial result with the rank whose number differs in bit k and
// combines the two. It is latency-optimal, the choice for small buffers.
//
// When n is not a power of two, with p the largest power of two below n, the first 2(n-p) ranks
// pair up first: each even one folds its data into the odd one above it and sits out, and gets the
// result back at the end.
//
// Every combination is computed as op(lower rank's data, higher rank's data) on both partners, so
// both compute from the same operands in the same order and hold the same bits after every step;
// by induction all ranks end bitwise identical (this matters for float sums and for min/max of
// signed zeros and NaNs, where op(a, b) and op(b, a) may differ).
func RecursiveDoublingAllreduce(ctx context.Context, c transport.Comm, buf []byte, t dtype.DType, op reduce.Op) error {
	if err := checkReduce("recursive doubling allreduce", buf, t, op); err != nil {
		return err
	}
	n, r := c.Size(), c.Rank()
	if n == 1 || len(buf) == 0 {
		return nil
	}
	seg := min(len(buf), segmentBytes)
	ws := getWorkspace(seg, 0)
	defer putWorkspace(ws)
	scratch := ws.buf[:seg]

	p := 1
	for p*2 <= n {
		p *= 2
	}
	extra := n - p
	// rankOf maps a rank of the power-of-two group back to c's rank.
	rankOf := func(v int) int {
		if v < extra {
			return 2*v + 1
		}
		return v + extra
	}

	var v int
	switch {
	case r < 2*extra && r%2 == 0:
		// Fold in: give our data to r+1, then wait for the result.
		if err := c.Send(ctx, r+1, buf); err != nil {
			return fmt.Errorf("recursive doubling allreduce: fold in: send to rank %d: %w", r+1, err)
		}
		if err := c.Recv(ctx, r+1, buf); err != nil {
			return fmt.Errorf("recursive doubling allreduce: fold out: recv result from rank %d: %w", r+1, err)
		}
		return nil
	case r < 2*extra:
		for off := 0; off < len(buf); off += seg {
			mine := segment(buf, off, seg)
			tmp := scratch[:len(mine)]
			if err := c.Recv(ctx, r-1, tmp); err != nil {
				return fmt.Errorf("recursive doubling allreduce: fold in: recv from rank %d: %w", r-1, err)
			}
			reduce.Many(t, op, mine, tmp, mine) // lower rank first
		}
		v = r / 2
	default:
		v = r - extra
	}

	for mask, step := 1, 1; mask < p; mask, step = mask<<1, step+1 {
		peer := rankOf(v ^ mask)
		for off := 0; off < len(buf); off += seg {
			mine := segment(buf, off, seg)
			tmp := scratch[:len(mine)]
			if err := c.SendRecv(ctx, peer, mine, peer, tmp); err != nil {
				return fmt.Errorf("recursive doubling allreduce: step %d: exchange with rank %d: %w", step, peer, err)
			}
			if peer < r {
				reduce.Many(t, op, mine, tmp, mine)
			} else {
				reduce.Many(t, op, mine, mine, tmp)
			}
		}
	}

	if r < 2*extra {
		if err := c.Send(ctx, r-1, buf); err != nil {
			return fmt.Errorf("recursive doubling allreduce: fold out: send result to rank %d: %w", r-1, err)
		}
	}
	return nil
}
