package collective

import (
	"context"
	"fmt"

	"github.com/kolo-dl/kolo/internal/dtype"
	"github.com/kolo-dl/kolo/internal/reduce"
	"github.com/kolo-dl/kolo/internal/transport"
)

// RingAllreduce reduces buf in place with the bandwidth-optimal ring: a reduce-scatter in which
// each rank ends up owning the full reduction of one n-th of buf, then an allgather that passes
// the owners' chunks around. Each rank sends and receives 2(n-1)/n of buf in 2(n-1) steps, always
// to rank+1 and from rank-1.
//
// Every rank ends with the same bits: each chunk is reduced on exactly one path around the ring and
// then copied, never reduced again. Chunks are cut at element boundaries; when buf has fewer
// elements than there are ranks some chunks are empty.
func RingAllreduce(ctx context.Context, c transport.Comm, buf []byte, t dtype.DType, op reduce.Op) error {
	if err := checkReduce("ring allreduce", buf, t, op); err != nil {
		return err
	}
	n := c.Size()
	if n == 1 || len(buf) == 0 {
		return nil
	}
	lo, hi := part(len(buf), t.Size(), n, 0) // part 0 is a largest one
	ws := getWorkspace(min(hi-lo, segmentBytes), n)
	defer putWorkspace(ws)
	bounds := partition(ws.bounds, len(buf), t.Size(), n)
	if err := ringReduceScatter(ctx, c, "ring allreduce", buf, bounds, t, op, ws.buf); err != nil {
		return err
	}
	return ringAllgather(ctx, c, "ring allreduce", buf, bounds)
}

// ringSegment is the segment length ringReduceScatter uses for chunks cut at bounds: the largest
// chunk, capped at segmentBytes. Every rank computes the same value from the same bounds.
func ringSegment(bounds []int) int {
	seg := 0
	for i := 1; i < len(bounds); i++ {
		seg = max(seg, bounds[i]-bounds[i-1])
	}
	return min(seg, segmentBytes)
}

// ringReduceScatter reduces buf in place so that chunk r (buf[bounds[r]:bounds[r+1]]) of rank r
// holds the reduction over all ranks; other chunks are left partly reduced. At step s rank r sends
// chunk r-s-1, which it finished accumulating at step s-1, and receives chunk r-s-2 into scratch
// to reduce into its own copy. Segments bound the scratch needed: scratch must hold
// ringSegment(bounds) bytes. Bounds must be multiples of the element size.
func ringReduceScatter(ctx context.Context, c transport.Comm, what string, buf []byte, bounds []int,
	t dtype.DType, op reduce.Op, scratch []byte) error {
	n, r := c.Size(), c.Rank()
	right, left := mod(r+1, n), mod(r-1, n)
	seg := ringSegment(bounds)
	if seg == 0 {
		return nil // every chunk is empty, on every rank
	}
	scratch = scratch[:seg]
	for s := 0; s < n-1; s++ {
		sc, rc := mod(r-s-1, n), mod(r-s-2, n)
		out := buf[bounds[sc]:bounds[sc+1]]
		in := buf[bounds[rc]:bounds[rc+1]]
		for off := 0; off < len(out) || off < len(in); off += seg {
			sseg := segment(out, off, seg)
			rseg := segment(in, off, seg)
			tmp := scratch[:len(rseg)]
			if err := c.SendRecv(ctx, right, sseg, left, tmp); err != nil {
				return fmt.Errorf("%s: reduce-scatter step %d of %d: send chunk %d to rank %d, recv chunk %d from rank %d: %w",
					what, s+1, n-1, sc, right, rc, left, err)
			}
			reduce.Into(t, op, rseg, tmp)
		}
	}
	return nil
}

// ringAllgather completes buf in place when rank r holds chunk r: at step s rank r passes on chunk
// r-s (its own, then the one it received last) and receives chunk r-s-1 straight into buf.
func ringAllgather(ctx context.Context, c transport.Comm, what string, buf []byte, bounds []int) error {
	n, r := c.Size(), c.Rank()
	right, left := mod(r+1, n), mod(r-1, n)
	for s := 0; s < n-1; s++ {
		sc, rc := mod(r-s, n), mod(r-s-1, n)
		out := buf[bounds[sc]:bounds[sc+1]]
		in := buf[bounds[rc]:bounds[rc+1]]
		if err := c.SendRecv(ctx, right, out, left, in); err != nil {
			return fmt.Errorf("%s: allgather step %d of %d: send chunk %d to rank %d, recv chunk %d from rank %d: %w",
				what, s+1, n-1, sc, right, rc, left, err)
		}
	}
	return nil
}
