package collective

import (
	"context"
	"fmt"

	"github.com/kolo-dl/kolo/internal/dtype"
	"github.com/kolo-dl/kolo/internal/reduce"
	"github.com/kolo-dl/kolo/internal/transport"
)

// ReduceScatter reduces send across all ranks and leaves block r of the result (counts[r] bytes,
// blocks in rank order) in rank r's recv. send is not modified. It is the reduce-scatter half of
// the ring allreduce, run on a copy of send; counts must be multiples of the element size and may
// differ and be zero. When c's ranks share memory it goes through the slots instead
// (sharedReduceScatter), with no copy of send.
func ReduceScatter(ctx context.Context, c transport.Comm, send []byte, recv []byte, counts []int, t dtype.DType, op reduce.Op, tun *Tuning) error {
	if err := checkReduce("reduce-scatter", send, t, op); err != nil {
		return err
	}
	n, r := c.Size(), c.Rank()
	if len(counts) != n {
		return fmt.Errorf("reduce-scatter: %d counts for %d ranks", len(counts), n)
	}
	total, largest := 0, 0
	for q, k := range counts {
		if k < 0 || k%t.Size() != 0 {
			return fmt.Errorf("reduce-scatter: count %d for rank %d is not a whole number of %v elements", k, q, t)
		}
		total += k
		largest = max(largest, k)
	}
	if len(send) != total || len(recv) != counts[r] {
		return fmt.Errorf("reduce-scatter: send holds %d bytes (counts add up to %d), recv %d (counts[%d] = %d)",
			len(send), total, len(recv), r, counts[r])
	}
	if s, ok := sharedOf(c, 128); ok && n > 1 && sharedReduceScatterFits(s, n, t) && !tun.noShared() {
		return sharedReduceScatter(ctx, c, s, send, recv, counts, t, op, tun)
	}
	seg := min(largest, segmentBytes)
	ws := getWorkspace(total+seg, n)
	defer putWorkspace(ws)
	work, scratch := ws.buf[:total], ws.buf[total:total+seg]
	copy(work, send)
	bounds := append(ws.bounds[:0], 0)
	for q, k := range counts {
		bounds = append(bounds, bounds[q]+k)
	}
	if n > 1 {
		if err := ringReduceScatter(ctx, c, "reduce-scatter", work, bounds, t, op, scratch); err != nil {
			return err
		}
	}
	copy(recv, work[bounds[r]:bounds[r+1]])
	return nil
}
