package engine

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/testbed/proctest"
)

// waitLog waits until the captured log contains want.
func waitLog(t *testing.T, logs *proctest.Buffer, want string) {
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

// Ranks whose calls went different ways (one waits on "a", the other on "b") fail both ops after
// StallCrossed, each rank with an error naming what the other waits on, and the next op works.
// A stall deadline far away does not hold them.
func TestCrossedWaitsFailEveryRank(t *testing.T) {
	cfg := DefaultConfig()
	cfg.StallCrossed = 300 * time.Millisecond
	c := newCluster(t, 2, cfg)
	ctx := waitCtx(t)
	start := time.Now()
	errs := make(chan error, 2)
	for r, name := range []string{"a", "b"} {
		go func() {
			buf := f32(1)
			errs <- c.engines[r].Enqueue(allreduceReq(name, 1), buf, buf).Wait(ctx)
		}()
	}
	for range 2 {
		err := <-errs
		var oe *OpError
		if !errors.As(err, &oe) || !strings.Contains(err.Error(), "calls went different ways") {
			t.Fatalf("err = %v, want an OpError about crossed calls", err)
		}
		if !strings.Contains(err.Error(), `waits on allreduce "a"`) && !strings.Contains(err.Error(), `waits on allreduce "b"`) {
			t.Errorf("the error does not say what the other rank waits on: %v", err)
		}
	}
	if d := time.Since(start); d < cfg.StallCrossed || d > 5*time.Second {
		t.Errorf("crossed ops failed after %v, want about %v", d, cfg.StallCrossed)
	}
	hs := []*Handle{c.engines[0].Enqueue(allreduceReq("next", 1), f32(1), f32(0)), c.engines[1].Enqueue(allreduceReq("next", 1), f32(2), f32(0))}
	for r, h := range hs {
		if err := h.Wait(ctx); err != nil {
			t.Errorf("rank %d: the op after: %v", r, err)
		}
	}
}

// The defaults: every op has a deadline, and HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=0 turns it off
// as in Horovod.
func TestStallDeadlineDefaults(t *testing.T) {
	def := DefaultConfig()
	if def.StallShutdown != DefaultStallShutdown || def.StallCrossed != DefaultStallCrossed || DefaultStallShutdown <= 0 || DefaultStallCrossed <= 0 {
		t.Fatalf("defaults %v %v", def.StallShutdown, def.StallCrossed)
	}
	env := map[string]string{"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "0", "KOLO_STALL_CROSSED_TIME_SECONDS": "2.5"}
	cfg, err := ConfigFromEnv(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if cfg.StallShutdown >= 0 || cfg.StallCrossed != 2500*time.Millisecond {
		t.Errorf("from the environment: shutdown %v (want off), crossed %v (want 2.5s)", cfg.StallShutdown, cfg.StallCrossed)
	}
	if stallDeadline(cfg, cfg.StallShutdown) != 0 || tickEvery(cfg) != 250*time.Millisecond {
		t.Errorf("deadline %v, tick %v", stallDeadline(cfg, cfg.StallShutdown), tickEvery(cfg))
	}
}
