package collective

import (
	"context"
	"fmt"

	"github.com/kolo-dl/kolo/internal/transport"
)

// barrierToken is the one byte each dissemination round sends. Senders only read it.
var barrierToken = []byte{0xba}

// Barrier returns once every rank of c has entered it. Over shared memory it is the Shared
// barrier; otherwise a dissemination barrier: in round k every rank sends one byte to rank+2^k and
// waits for one from rank-2^k, so after ceil(log2 n) rounds each rank has heard, directly or
// through others, from every rank.
func Barrier(ctx context.Context, c transport.Comm) error {
	n, r := c.Size(), c.Rank()
	if n == 1 {
		return nil
	}
	if s, ok := sharedOf(c, 1); ok {
		if err := s.Barrier(ctx); err != nil {
			return fmt.Errorf("barrier: %w", err)
		}
		return nil
	}
	var got [1]byte
	for k, round := 1, 1; k < n; k, round = k<<1, round+1 {
		to, from := mod(r+k, n), mod(r-k, n)
		if err := c.SendRecv(ctx, to, barrierToken, from, got[:]); err != nil {
			return fmt.Errorf("barrier: round %d: signal rank %d, wait for rank %d: %w", round, to, from, err)
		}
	}
	return nil
}
