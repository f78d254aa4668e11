package kolo_test

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/testbed/e2e"
	"github.com/kolo-dl/kolo/testbed/proctest"
)

// Elastic mode inside a Slurm allocation (a one-node cluster the test starts): kolo run takes
// its hosts from the allocation and starts every worker as a job step of its own; a step that
// dies fails its worker like any other, and nothing is left running in the allocation.
func TestElasticSlurm(t *testing.T) {
	slurm := e2e.StartSlurm(t, 8)
	kolo, softmax := buildKolo(t), buildSoftmax(t)

	// salloc runs kolo run here, in an allocation of 4 tasks on the node.
	start := func(t *testing.T, steps string) (*proctest.Buffer, chan error) {
		return salloc(t, slurm, []string{"-n", "4"}, kolo, "run", "--min-np", "2", "--max-np", "4",
			softmax, "-elastic", "-steps", steps, "-commit", "10", "-pace", "5ms")
	}
	// steps lists the job's kolo worker steps: "jobid.stepid name" per line.
	steps := func() []string {
		out, _ := slurm.Command(context.Background(), nil, "squeue", "-h", "-s", "-o", "%i %j").Output()
		var ws []string
		for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			if strings.Contains(l, " kolo:") {
				ws = append(ws, l)
			}
		}
		return ws
	}
	awaitSteps := func(t *testing.T, n int, out *proctest.Buffer) []string {
		deadline := time.Now().Add(60 * time.Second)
		for {
			if ws := steps(); len(ws) >= n {
				return ws
			}
			if time.Now().After(deadline) {
				t.Fatalf("fewer than %d kolo worker steps in the allocation after 60 s: %v\n%s", n, steps(), out.String())
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	t.Run("every worker a step", func(t *testing.T) {
		out, done := start(t, "400")
		ws := awaitSteps(t, 4, out)
		if err := <-done; err != nil {
			t.Fatalf("salloc kolo run: %v\n%s", err, out.String())
		}
		for _, want := range []string{
			"each worker starts as a job step of its own (srun)",
			"round 1: generation 1: 4 ranks on 1 host",
			"trained on 4 ranks: every rank holds identical weights",
		} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("output lacks %q\n%s", want, out.String())
			}
		}
		requireNoStepsLeft(t, out)
		t.Logf("worker steps: %v", ws)
	})

	// Its one host blacklisted, the job cannot go on: it says so and ends, every step with it.
	t.Run("a worker's step killed", func(t *testing.T) {
		out, done := start(t, "100000")
		ws := awaitSteps(t, 4, out)
		// squeue lists a step before its task runs, and a signal sent to a step without its task
		// is lost (the job then trained on, 90 s, in one CI run): kill once every rank trains.
		for deadline := time.Now().Add(60 * time.Second); !strings.Contains(out.String(), "step   50 "); time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("no training step 50 after 60 s\n%s", out.String())
			}
		}
		victim := strings.Fields(ws[len(ws)-1])[0]
		killed := time.Now()
		if b, err := slurm.Command(context.Background(), nil, "scancel", "--signal=KILL", victim).CombinedOutput(); err != nil {
			t.Fatalf("scancel %s: %v: %s", victim, err, b)
		}
		select {
		case err := <-done:
			var ee *exec.ExitError
			if err == nil || !errors.As(err, &ee) {
				t.Fatalf("salloc kolo run: %v, want a failure\n%s", err, out.String())
			}
		case <-time.After(90 * time.Second):
			t.Fatalf("kolo run still running 90 s after a step was killed\n%s", out.String())
		}
		if !regexp.MustCompile(`every host blacklisted|below --min-np|blacklisted`).MatchString(out.String()) {
			t.Errorf("the job did not say why it ended\n%s", out.String())
		}
		requireNoStepsLeft(t, out)
		t.Logf("step %s killed; the job ended %.1f s later", victim, time.Since(killed).Seconds())
	})
}

// Elastic mode across the nodes of an allocation (3 Slurm nodes, each in a network namespace, 2
// tasks each): a worker of the third node is SIGKILLed. Its step fails, the launcher blacklists
// the node and ends its other step, and the workers of the other two nodes, in their own steps
// and never restarted, go on as a world of 4 from their last commit.
func TestElasticSlurmNodeLost(t *testing.T) {
	ns := e2e.NewNetns(t, 3)
	slurm := e2e.StartSlurmNodes(t, ns, 2)
	kolo, softmax := buildKolo(t), buildSoftmax(t)
	out, done := salloc(t, slurm, []string{"-N", "3", "--ntasks-per-node", "2"}, kolo, "run", "--min-np", "2",
		"--network-interface", ns.Bridge+",eth0", softmax, "-elastic", "-steps", "1500", "-commit", "10", "-pace", "5ms")
	awaitMatch(t, out, regexp.MustCompile(`<stdout>:step +200 `), 90*time.Second)
	before := workerPids(out.String())
	victim := before[slurm.Nodes[2]+"[1]"]
	if len(before) != 6 || len(victim) != 1 {
		t.Fatalf("worker pids: %v\n%s", before, out.String())
	}
	killed := time.Now()
	if err := syscall.Kill(victim[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	awaitMatch(t, out, regexp.MustCompile(`<stdout>:round \d+: 4 ranks from step`), 60*time.Second)
	resumed := time.Since(killed)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("salloc kolo run: %v\n%s", err, out.String())
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("kolo run still running\n%s", out.String())
	}
	after := workerPids(out.String())
	for _, n := range slurm.Nodes[:2] {
		for s := range 2 {
			place := fmt.Sprintf("%s[%d]", n, s)
			if len(after[place]) != 1 || after[place][0] != before[place][0] {
				t.Errorf("survivor %s was restarted: pids %v", place, after[place])
			}
		}
	}
	for _, want := range []string{"each worker starts as a job step of its own (srun)", "trained on 4 ranks: every rank holds identical weights"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q\n%s", want, out.String())
		}
	}
	requireNoStepsLeft(t, out)
	if resumed > 10*time.Second {
		t.Errorf("the survivors trained again %.1f s after the kill, want within 10 s", resumed.Seconds())
	}
	t.Logf("worker %s killed; the 4 survivors trained again within %.2f s", slurm.Nodes[2]+"[1]", resumed.Seconds())
}

// stepsAfterRun runs as the allocation's command: kolo run (its arguments), then, with the
// allocation still held, a wait for kolo's worker steps to leave squeue, and a line naming those
// still there (or none), and kolo run's exit status. srun returns when its tasks have exited, but
// slurmctld drops the step only when slurmstepd reports it complete, a moment later; once salloc
// releases the allocation, Slurm ends every step itself, so a look from outside after the job
// either races that report or proves nothing. Inside the allocation a step that kolo run left
// running stays listed until the bound (20 s), and one merely being reported goes within it.
const stepsAfterRun = `"$@"; rc=$?
i=0
while :; do
	s=$(squeue -h -s -j "$SLURM_JOB_ID" -o '%i %j') || s="squeue failed"
	left=$(printf '%s\n' "$s" | grep -e ' kolo:' -e 'squeue failed' | tr '\n' ' ')
	[ -z "$left" ] || [ $i -ge 200 ] && break
	i=$((i+1)); sleep 0.1
done
echo "kolo steps after kolo run: ${left:-none}"
exit $rc`

// requireNoStepsLeft fails t unless out (from salloc) says no kolo step outlived kolo run.
func requireNoStepsLeft(t *testing.T, out *proctest.Buffer) {
	t.Helper()
	if !strings.Contains(out.String(), "kolo steps after kolo run: none\n") {
		t.Errorf("worker steps left 20 s after kolo run ended, in the allocation:\n%s", out.String())
	}
}

// salloc starts kolo (argv) under salloc with its allocation flags, in the test's cluster, then
// waits in the allocation for kolo's steps to end (stepsAfterRun); the output collects in out
// and salloc's end arrives on done. t's cleanup stops it.
func salloc(t *testing.T, slurm *e2e.Slurm, flags []string, argv ...string) (out *proctest.Buffer, done chan error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	argv = append([]string{"--", "sh", "-c", stepsAfterRun, "sh"}, argv...)
	cmd := slurm.Command(ctx, nil, "salloc", append(flags, argv...)...)
	cmd.Env = launchEnv(cmd.Env...)
	out = &proctest.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done = make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	return out, done
}

// awaitMatch waits, up to timeout, for out to match re.
func awaitMatch(t *testing.T, out *proctest.Buffer, re *regexp.Regexp, timeout time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(timeout); !re.MatchString(out.String()); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("nothing matched %s within %s\n%s", re, timeout, out.String())
		}
	}
}
