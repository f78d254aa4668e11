package kolo

import (
	"errors"
	"testing"
	"time"
)

// A script reads the figures its reports carry: steps and their times, bytes reduced, ops done;
// before Init it gets ErrNotInitialized.
func TestRankStats(t *testing.T) {
	if _, err := RankStats(); !errors.Is(err, ErrNotInitialized) {
		t.Fatalf("before Init: err = %v, want ErrNotInitialized", err)
	}
	initSingle(t)
	buf, out := make([]float32, 256), make([]float32, 256)
	const steps = 5
	for range steps {
		time.Sleep(2 * time.Millisecond)
		wait(t, AllreduceAsync("grad", Of(buf), Of(out), Sum))
		MarkStep()
	}
	st, err := RankStats()
	if err != nil {
		t.Fatal(err)
	}
	if st.Rank != 0 || st.Steps != steps || st.OpsDone < steps || st.OpsFailed != 0 {
		t.Errorf("stats = %+v, want rank 0, %d steps, at least %d ops done, none failed", st, steps, steps)
	}
	if st.StepMedian < 2*time.Millisecond || st.StepP95 < st.StepMedian || st.Up < steps*2*time.Millisecond {
		t.Errorf("step median %v, p95 %v, up %v: want steps of 2 ms or more", st.StepMedian, st.StepP95, st.Up)
	}
	if st.InCollectives > st.Up {
		t.Errorf("in collectives %v longer than up %v", st.InCollectives, st.Up)
	}
}
