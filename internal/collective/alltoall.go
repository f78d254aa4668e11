package collective

import (
	"context"
	"fmt"

	"github.com/kolo-dl/kolo/internal/transport"
)

// Alltoall sends block q of send (sendCounts[q] bytes, blocks in rank order) to rank q, and
// receives rank q's block for this rank into block q of recv (recvCounts[q] bytes). Splits may be
// uneven and zero; recvCounts[q] on this rank must equal sendCounts[this rank] on rank q. It is a
// pairwise exchange: at step k rank r sends to r+k while receiving from r-k, so every rank talks
// to a different peer at each step and no link is idle or doubly loaded. When more than two ranks
// share memory the blocks go through the slots (sharedAlltoall), which reserves no pair ring; two
// have one ring each way, which the slots do not beat.
func Alltoall(ctx context.Context, c transport.Comm, send []byte, sendCounts []int, recv []byte, recvCounts []int, tun *Tuning) error {
	n, r := c.Size(), c.Rank()
	if len(sendCounts) != n || len(recvCounts) != n {
		return fmt.Errorf("alltoall: %d send counts and %d recv counts for %d ranks", len(sendCounts), len(recvCounts), n)
	}
	ws := getWorkspace(0, 2*n+1)
	defer putWorkspace(ws)
	offs := ws.bounds[:2*n+2]
	soff, roff := offs[:0:n+1], offs[n+1:n+1]
	soff = append(soff, 0)
	for q, k := range sendCounts {
		if k < 0 {
			return fmt.Errorf("alltoall: negative send count %d for rank %d", k, q)
		}
		soff = append(soff, soff[q]+k)
	}
	roff = append(roff, 0)
	for q, k := range recvCounts {
		if k < 0 {
			return fmt.Errorf("alltoall: negative recv count %d for rank %d", k, q)
		}
		roff = append(roff, roff[q]+k)
	}
	if len(send) != soff[n] || len(recv) != roff[n] {
		return fmt.Errorf("alltoall: send holds %d bytes (counts say %d), recv %d (counts say %d)",
			len(send), soff[n], len(recv), roff[n])
	}
	if sendCounts[r] != recvCounts[r] {
		return fmt.Errorf("alltoall: rank %d sends itself %d bytes but expects %d", r, sendCounts[r], recvCounts[r])
	}
	copy(recv[roff[r]:roff[r+1]], send[soff[r]:soff[r+1]])
	if n == 1 {
		return nil
	}
	if s, ok := sharedOf(c, 128); ok && n > 2 && sharedAlltoallFits(s, n) && !tun.noShared() {
		return sharedAlltoall(ctx, c, s, send, soff, recv, roff, tun)
	}
	for k := 1; k < n; k++ {
		to, from := mod(r+k, n), mod(r-k, n)
		if err := c.SendRecv(ctx, to, send[soff[to]:soff[to+1]], from, recv[roff[from]:roff[from+1]]); err != nil {
			return fmt.Errorf("alltoall: step %d of %d: send %d bytes to rank %d, recv %d bytes from rank %d: %w",
				k, n-1, sendCounts[to], to, recvCounts[from], from, err)
		}
	}
	return nil
}
