package kolo_test

import (
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// buildSoftmax is the Go example built from this tree, once for the test binary.
func buildSoftmax(t testing.TB) string { return buildOnce(t, "./examples/softmax") }

var (
	workerPidLine = regexp.MustCompile(`(?m)^\[([^\]]+\[\d+\])\]<stdout>:worker pid (\d+)$`)
	roundLine     = regexp.MustCompile(`(?m)<stdout>:round (\d+): (\d+) ranks from step (\d+)$`)
	stepLine      = regexp.MustCompile(`(?m)<stdout>:step +(\d+) `)
)

// workerPids maps each place to the pids that printed there, in order.
func workerPids(out string) map[string][]int {
	m := map[string][]int{}
	for _, l := range workerPidLine.FindAllStringSubmatch(out, -1) {
		pid, _ := strconv.Atoi(l[2])
		m[l[1]] = append(m[l[1]], pid)
	}
	return m
}

// The Go elastic loop end to end: 4 workers on two host names of this machine, one killed with
// SIGKILL mid-training. Its host is blacklisted, its other worker stopped, and the two
// survivors go on as a world of 2 from their last commit: same processes, no step lost beyond
// the commit interval, identical weights at the end.
func TestElasticGoSurvivesAKilledWorker(t *testing.T) {
	kolo, softmax := buildKolo(t), buildSoftmax(t)
	l := startLauncher(t, launchEnv(), kolo, "run", "-np", "4", "--min-np", "2", "--max-np", "4",
		"-H", "localhost:2,127.0.0.1:2", softmax, "-elastic", "-steps", "400", "-commit", "10", "-pace", "5ms")
	l.waitOutput(t, regexp.MustCompile(`<stdout>:step +100 `), 1, 60*time.Second)
	pids := workerPids(l.stdout.String())
	victim := pids["127.0.0.1[1]"]
	if len(victim) != 1 || len(pids) != 4 {
		t.Fatalf("worker pids before the kill: %v\n%s", pids, l.output())
	}
	killed := time.Now()
	if err := syscall.Kill(victim[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	l.waitOutput(t, regexp.MustCompile(`<stdout>:round \d+: 2 ranks from step`), 1, 30*time.Second)
	resumed := time.Since(killed)
	if code := l.wait(t, 60*time.Second); code != 0 {
		t.Fatalf("kolo run exited %d\n%s", code, l.output())
	}
	out := l.stdout.String()
	after := workerPids(out)
	for _, place := range []string{"localhost[0]", "localhost[1]"} {
		if len(after[place]) != 1 || after[place][0] != pids[place][0] {
			t.Errorf("survivor %s was restarted: pids %v", place, after[place])
		}
	}
	if len(after["127.0.0.1[0]"]) != 1 || len(after["127.0.0.1[1]"]) != 1 {
		t.Errorf("a worker of the blacklisted host was started again: %v", after)
	}
	rounds := roundLine.FindAllStringSubmatch(out, -1)
	last := rounds[len(rounds)-1]
	from, _ := strconv.Atoi(last[3])
	if last[2] != "2" || from < 100-10 {
		t.Errorf("the last round is %q: want 2 ranks from at least step 90 (the commit before the kill)", last[0])
	}
	if !strings.Contains(out, "trained on 2 ranks: every rank holds identical weights") {
		t.Errorf("no identical-weights line\n%s", l.output())
	}
	if !strings.Contains(l.stderr.String(), "127.0.0.1") {
		t.Errorf("the launcher did not say which host it lost\n%s", l.output())
	}
	t.Logf("new world trained again %.2f s after the kill (rounds: %v)", resumed.Seconds(), rounds)
}
