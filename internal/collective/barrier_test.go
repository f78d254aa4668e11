package collective

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/kolo-dl/kolo/internal/transport"
	"github.com/kolo-dl/kolo/internal/transport/inmem"
)

func TestBarrier(t *testing.T) {
	for _, shared := range []bool{false, true} {
		for _, n := range rankCounts {
			t.Run(fmt.Sprintf("shared=%v/n=%d", shared, n), func(t *testing.T) {
				var opts []inmem.Option
				if !shared {
					opts = []inmem.Option{inmem.WithoutShared()}
				}
				var arrived atomic.Int64
				const rounds = 100
				mustRanks(t, n, opts, nil, func(ctx context.Context, r int, c transport.Comm) error {
					for round := 1; round <= rounds; round++ {
						for range (r * round) % 3 { // arrive in a different order each round
							runtime.Gosched()
						}
						arrived.Add(1)
						if err := Barrier(ctx, c); err != nil {
							return fmt.Errorf("round %d: %w", round, err)
						}
						if got := arrived.Load(); got < int64(round*n) {
							return fmt.Errorf("round %d: left the barrier after %d of %d arrivals", round, got, round*n)
						}
					}
					return nil
				})
			})
		}
	}
}
