package engine

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/autotune"
	"github.com/kolo-dl/kolo/transport/inmem"
)

// scriptTuner is a tuner that asks for fixed settings at fixed steps and decides at done.
type scriptTuner struct {
	at   map[int64]autotune.Settings // step it decides at -> settings, from step+2
	done int64
	last int64
}

func (s *scriptTuner) Step(step int64, now time.Time) (autotune.Settings, int64, bool) {
	s.last = step
	st, ok := s.at[step]
	return st, step + 2, ok
}
func (s *scriptTuner) Done() bool { return s.last >= s.done }
func (s *scriptTuner) Result() autotune.Result {
	return autotune.Result{Decided: s.last >= s.done, Chosen: s.at[3], Speedup: 1.07, Low: 1.04, High: 1.1, DecidedAt: s.last}
}
func (s *scriptTuner) Close() error { return nil }

// The settings rank 0's tuner asks for come into force on every rank at the step it names, not
// when its message arrives, and the job's results do not change with them.
func TestTunedSettingsSwitchAtOneStepOnEveryRank(t *testing.T) {
	const n, steps = 3, 14
	captureLog(t)
	c := newClusterWith(t, n, DefaultConfig(), []inmem.Option{inmem.WithoutShared()}, nil)
	a := autotune.Settings{FusionBytes: 1 << 20, CycleTime: 2 * time.Millisecond}
	b := autotune.Settings{FusionBytes: 0, CycleTime: 0}
	e0 := c.engines[0]
	e0.tune.mu.Lock()
	e0.tune.tuner = &scriptTuner{at: map[int64]autotune.Settings{3: a, 8: b}, done: 11}
	e0.tune.mu.Unlock()
	ctx := waitCtx(t)
	var wg sync.WaitGroup
	errs := make([]error, n)
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Rank 2 runs behind, as a slow rank does: it still switches at the same steps.
			for s := 1; s <= steps; s++ {
				if r == 2 {
					time.Sleep(3 * time.Millisecond)
				}
				for i := range 3 {
					buf := f32(float32(r + 1))
					if err := c.engines[r].Enqueue(allreduceReq(fmt.Sprintf("g%d", i), 1), buf, buf).Wait(ctx); err != nil {
						errs[r] = err
						return
					}
					if got := getF32(buf)[0]; got != 6 {
						errs[r] = fmt.Errorf("step %d: sum %v, want 6", s, got)
						return
					}
				}
				c.engines[r].MarkStep()
			}
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	want := []AppliedSettings{
		{Step: 5, Wanted: 5, FusionBytes: a.FusionBytes, CycleTime: a.CycleTime},
		{Step: 10, Wanted: 10, FusionBytes: b.FusionBytes, CycleTime: b.CycleTime},
	}
	for r := range n {
		got := c.engines[r].AppliedSettings()
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("rank %d applied %+v, want %+v", r, got, want)
		}
	}
	if got := c.engines[1].tune.cycle.Load(); got != 0 {
		t.Errorf("rank 1's cycle time after the last switch: %v", time.Duration(got))
	}
	if r := e0.AutotuneReport(); !strings.Contains(r, "1.07x the defaults' steps/s") {
		t.Errorf("rank 0's report %q", r)
	}
	if r := c.engines[1].AutotuneReport(); r != "" {
		t.Errorf("rank 1 reports %q; only rank 0 tunes", r)
	}
}
