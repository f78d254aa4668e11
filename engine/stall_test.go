package engine

import (
	"strings"
	"testing"
	"time"
)

// waitLog waits until the captured log contains want.
func waitLog(t *testing.T, logs *logCapture, want string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(logs.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("no %q in the log within 5 s:\n%s", want, logs.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// After a stall is reported, a rank that submits leaves the list of culprits: later warnings and
// the fatal error name only the ranks still missing; and an op the last culprit completes is
// reported no more.
func TestStallNamesTheRanksMissingNow(t *testing.T) {
	cfg := DefaultConfig()
	cfg.StallWarning = 100 * time.Millisecond
	cfg.StallShutdown = 1500 * time.Millisecond
	logs := captureLog(t)
	c := newCluster(t, 3, cfg)
	ctx := waitCtx(t)
	wait := func(r int, name string) chan error {
		done := make(chan error, 1)
		go func() {
			buf := f32(1)
			done <- c.engines[r].Enqueue(allreduceReq(name, 1), buf, buf).Wait(ctx)
		}()
		return done
	}

	// "x": rank 1 comes late, rank 2 never.
	x0 := wait(0, "x")
	waitLog(t, logs, `x\" after`) // the first warning...
	if log := logs.String(); !strings.Contains(log, "missing ranks 1,2; submitted by rank 0") {
		t.Fatalf("first warning does not name ranks 1 and 2:\n%s", log)
	}
	x1 := wait(1, "x")
	waitLog(t, logs, "missing rank 2; submitted by ranks 0,1")
	for r, done := range []chan error{x0, x1} {
		err := <-done
		if err == nil || !strings.Contains(err.Error(), "rank 2 never submitted it") || strings.Contains(err.Error(), "ranks 1,2") {
			t.Errorf("rank %d: err = %v, want a stall error naming rank 2 alone", r, err)
		}
	}
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	var last string
	for _, l := range lines {
		if strings.Contains(l, `x\" after`) {
			last = l
		}
	}
	if !strings.Contains(last, "(fatal)") || !strings.Contains(last, "missing rank 2; submitted by ranks 0,1") {
		t.Errorf("last report of x: %s", last)
	}

	// "y": rank 2 is late but in time; once it runs, nobody is reported for it.
	y0, y1 := wait(0, "y"), wait(1, "y")
	waitLog(t, logs, `y\" after`)
	if err := <-wait(2, "y"); err != nil {
		t.Fatal(err)
	}
	for _, done := range []chan error{y0, y1} {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	reports := strings.Count(logs.String(), `y\" after`)
	time.Sleep(3 * cfg.StallWarning)
	if n := strings.Count(logs.String(), `y\" after`); n != reports {
		t.Errorf("y was reported %d more times after it ran:\n%s", n-reports, logs.String())
	}
}
