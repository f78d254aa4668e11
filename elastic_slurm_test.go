package kolo_test

import (
	"context"
	"errors"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/e2e"
)

// Elastic mode inside a Slurm allocation (a one-node cluster the test starts): kolo run takes
// its hosts from the allocation and starts every worker as a job step of its own; a step that
// dies fails its worker like any other, and nothing is left running in the allocation.
func TestElasticSlurm(t *testing.T) {
	slurm := e2e.StartSlurm(t, 8)
	kolo, softmax := buildKolo(t), buildSoftmax(t)

	// salloc runs kolo run here, in an allocation of 4 tasks on the node.
	start := func(t *testing.T, steps string) (*exec.Cmd, *lockedBuffer, chan error) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		t.Cleanup(cancel)
		cmd := slurm.Command(ctx, nil, "salloc", "-n", "4", "--", kolo, "run", "--min-np", "2", "--max-np", "4",
			softmax, "-elastic", "-steps", steps, "-commit", "10", "-pace", "5ms")
		cmd.Env = launchEnv(cmd.Env...)
		var out lockedBuffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		return cmd, &out, done
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
	awaitSteps := func(t *testing.T, n int, out *lockedBuffer) []string {
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
		_, out, done := start(t, "400")
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
		if left := steps(); len(left) != 0 {
			t.Errorf("worker steps left after the job: %v", left)
		}
		t.Logf("worker steps: %v", ws)
	})

	// Its one host blacklisted, the job cannot go on: it says so and ends, every step with it.
	t.Run("a worker's step killed", func(t *testing.T) {
		_, out, done := start(t, "100000")
		ws := awaitSteps(t, 4, out)
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
		if left := steps(); len(left) != 0 {
			t.Errorf("worker steps left after the job: %v", left)
		}
		t.Logf("step %s killed; the job ended %.1f s later", victim, time.Since(killed).Seconds())
	})
}
