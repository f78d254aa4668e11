package engine

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

// Rank 0 names the rank the others wait for from when their submissions reach it: a rank that
// sleeps before each step's ops is named within 10 steps; with none slowed, nobody is.
func TestSlowestRankNamed(t *testing.T) {
	for _, tc := range []struct {
		name  string
		slow  int // -1: none
		steps int
	}{{"rank 3 slowed", 3, 10}, {"none slowed", -1, 30}} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, 4, DefaultConfig())
			ctx := waitCtx(t)
			var wg sync.WaitGroup
			for r, e := range c.engines {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for s := range tc.steps {
						if r == tc.slow {
							time.Sleep(20 * time.Millisecond)
						}
						hs := make([]*Handle, 3)
						for i := range hs {
							buf := f32(1)
							hs[i] = e.Enqueue(allreduceReq(fmt.Sprintf("grad.%d", i), 1), buf, buf)
						}
						for _, h := range hs {
							if err := h.Wait(ctx); err != nil {
								t.Errorf("rank %d step %d: %v", r, s, err)
								return
							}
						}
						e.MarkStep()
					}
				}()
			}
			wg.Wait()
			// Look as rank 0's driver: the tracker is its own. It closes a step at its next cycle
			// after the mark.
			e0 := c.engines[0]
			for !e0.tryAcquire() {
				time.Sleep(time.Millisecond)
			}
			e0.obs.closeSteps()
			v, named := e0.obs.track.Slowest()
			e0.release()
			switch {
			case tc.slow >= 0 && (!named || v.Rank != tc.slow):
				t.Errorf("after %d steps: named %v (%+v), want rank %d", tc.steps, named, v, tc.slow)
			case tc.slow < 0 && named:
				t.Errorf("no rank slowed, but rank %d named: %+v", v.Rank, v)
			}
		})
	}
}
