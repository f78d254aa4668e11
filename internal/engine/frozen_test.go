package engine

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/transport"
	"github.com/kolo-dl/kolo/internal/transport/inmem"
)

// freezable is a rank's Messenger whose sends stop while frozen is set, as a stopped process's
// would: no batches and no heartbeats leave it.
type freezable struct {
	transport.Messenger
	frozen *atomic.Bool
}

func (f freezable) SendMsg(ctx context.Context, peer int, body []byte) error {
	if f.frozen.Load() {
		<-ctx.Done() // a stopped process sends nothing, ever: hold the sender until it gives up
		return ctx.Err()
	}
	return f.Messenger.SendMsg(ctx, peer, body)
}

// A rank frozen between two ops (it submits nothing and sends nothing, not even its heartbeat)
// fails the job within about the progress deadline, every rank naming it; a rank that merely
// computes for twice the deadline (its heartbeat goes on) fails nothing.
func TestFrozenRankBetweenOps(t *testing.T) {
	const limit = 600 * time.Millisecond
	for _, tc := range []struct {
		name   string
		frozen bool
	}{{"frozen", true}, {"computing", false}} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.ProgressTimeout = limit
			var frozen atomic.Bool
			c := newClusterWith(t, 3, cfg, []inmem.Option{inmem.WithProgressTimeout(limit)}, func(r int, ep *inmem.Endpoint, g *Group) {
				if r == 2 {
					g.Messenger = freezable{g.Messenger, &frozen}
				}
			})
			frozen.Store(tc.frozen)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			start := time.Now()
			hs := []*Handle{
				c.engines[0].Enqueue(allreduceReq("next", 1), f32(1), f32(1)),
				c.engines[1].Enqueue(allreduceReq("next", 1), f32(1), f32(1)),
			}
			if !tc.frozen {
				time.Sleep(2 * limit) // rank 2 computes
				if err := c.engines[2].Enqueue(allreduceReq("next", 1), f32(1), f32(1)).Wait(ctx); err != nil {
					t.Fatalf("rank 2 after computing for twice the deadline: %v", err)
				}
			}
			for r, h := range hs {
				err := h.Wait(ctx)
				if !tc.frozen {
					if err != nil {
						t.Errorf("rank %d: %v", r, err)
					}
					continue
				}
				var stuck *StuckError
				if !errors.As(err, &stuck) || stuck.Rank != 2 || !strings.Contains(err.Error(), "rank 2") {
					t.Errorf("rank %d: %v, want a StuckError naming rank 2", r, err)
				}
			}
			if took := time.Since(start); tc.frozen && took > 3*limit {
				t.Errorf("the frozen rank was named after %v, deadline %v", took, limit)
			}
		})
	}
}
