package collective

import (
	"context"
	"fmt"

	"github.com/kolo-dl/kolo/internal/transport"
)

// Allgather concatenates every rank's send into recv, in rank order: rank r's counts[r] bytes land
// at offset counts[0]+...+counts[r-1]. Counts may differ per rank (a tensor whose first dimension
// differs) and may be zero. It runs a ring: at each of n-1 steps every rank passes on to rank+1
// the block it received last, so each link carries each block once.
//
// When more than two ranks share memory, the blocks go through their owners' slots instead
// (sharedAllgather): every rank reads every block once, all at once, one barrier per piece. Two
// ranks have one pair ring each way, which pipelines finer than pieces between barriers
// (BenchmarkExchanges: 4 MiB at 7.4 GB/s through the ring, 5.8 through the slots).
//
// send may be recv's own block (in place); otherwise it must not overlap recv.
func Allgather(ctx context.Context, c transport.Comm, send []byte, recv []byte, counts []int, tun *Tuning) error {
	n, r := c.Size(), c.Rank()
	if len(counts) != n {
		return fmt.Errorf("allgather: %d counts for %d ranks", len(counts), n)
	}
	ws := getWorkspace(0, n)
	defer putWorkspace(ws)
	bounds := append(ws.bounds[:0], 0)
	for q, k := range counts {
		if k < 0 {
			return fmt.Errorf("allgather: negative count %d for rank %d", k, q)
		}
		bounds = append(bounds, bounds[q]+k)
	}
	if len(send) != counts[r] {
		return fmt.Errorf("allgather: rank %d sends %d bytes but counts[%d] = %d", r, len(send), r, counts[r])
	}
	if len(recv) != bounds[n] {
		return fmt.Errorf("allgather: recv holds %d bytes, counts add up to %d", len(recv), bounds[n])
	}
	copy(recv[bounds[r]:bounds[r+1]], send)
	if n == 1 {
		return nil
	}
	if s, ok := sharedOf(c, 128); ok && n > 2 && !tun.noShared() {
		return sharedAllgather(ctx, c, s, recv, bounds, tun)
	}
	return ringAllgather(ctx, c, "allgather", recv, bounds)
}
