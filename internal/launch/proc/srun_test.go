package proc

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/jobenv"
	"github.com/kolo-dl/kolo/internal/launch/layout"
)

// A worker's step: one task on its node, sharing the allocation, surviving other steps' failures,
// named after its place; the allocation shell's layout variables do not reach srun.
func TestSlurmStarterCommand(t *testing.T) {
	s := &SlurmStarter{JobID: "42"}
	w := Worker{Slot: layout.Slot{Host: "node7", LocalRank: 0}, Argv: []string{"python", "train.py", "--lr", "0.1"}, Dir: "/work",
		Env: []string{"SLURM_NTASKS=8", "SLURM_JOB_ID=42", "SLURM_TASKS_PER_NODE=4(x2)", "PATH=/bin",
			jobenv.Elastic + "=1", jobenv.ElasticHost + "=node7", jobenv.ElasticSlot + "=3", jobenv.ElasticRound + "=2"}}
	got := strings.Join(s.slurmArgs(w), " ")
	want := "srun --jobid=42 --nodes=1 --ntasks=1 --nodelist=node7 --overlap --kill-on-bad-exit=0 --cpu-bind=none --mpi=none " +
		"--export=ALL --unbuffered --quiet --job-name=kolo:node7[3] --chdir=/work -- python train.py --lr 0.1"
	if got != want {
		t.Errorf("srun command\n got %s\nwant %s", got, want)
	}
	env := strings.Join(withoutSlurmLayout(w.Env), " ")
	if strings.Contains(env, "SLURM_NTASKS") || strings.Contains(env, "SLURM_TASKS_PER_NODE") || !strings.Contains(env, "SLURM_JOB_ID=42") || !strings.Contains(env, "PATH=/bin") {
		t.Errorf("environment given to srun: %s", env)
	}
}

// A worker's step is stopped through srun: SIGTERM is passed on as is; SIGKILL is SIGINTs in a
// row until srun ends (on the second it takes, srun kills the step), and srun itself is killed if
// it has not ended after KillAfter.
func TestSlurmStarterSignals(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "signals")
	// A fake srun that records the signals it gets and runs nothing: "obedient" ends at the
	// second SIGINT, as srun does; "deaf" ignores every one.
	fake := func(name, onSecondInt string) string {
		p := filepath.Join(dir, name)
		script := fmt.Sprintf(`#!/bin/sh
n=0
trap 'echo TERM >> %[1]s; exit 143' TERM
trap 'echo INT >> %[1]s; n=$((n+1)); if [ $n -ge 2 ]; then %[2]s; fi' INT
echo started >> %[1]s
while :; do sleep 0.01; done
`, log, onSecondInt)
		if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	start := func(prog string) Process {
		os.Remove(log)
		// KillAfter far beyond the gap between the two SIGINTs: a loaded machine delays the trap.
		s := &SlurmStarter{JobID: "1", Program: prog, KillAfter: 1500 * time.Millisecond}
		p, err := s.Start(context.Background(), Worker{Slot: layout.Slot{Host: "n1"}, Argv: []string{"train"}, Env: os.Environ()})
		if err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			if b, _ := os.ReadFile(log); strings.Contains(string(b), "started") {
				return p
			}
			if time.Now().After(deadline) {
				t.Fatal("the fake srun did not start")
			}
		}
	}
	record := func() string {
		b, _ := os.ReadFile(log)
		return strings.Join(strings.Fields(string(b)), " ")
	}
	wait := func(p Process) Exit {
		done := make(chan Exit, 1)
		go func() { done <- p.Wait() }()
		select {
		case e := <-done:
			return e
		case <-time.After(5 * time.Second):
			t.Fatal("srun still running 5 s after it was signalled")
		}
		return Exit{}
	}

	p := start(fake("obedient", "exit 137"))
	p.Signal(syscall.SIGTERM)
	if e := wait(p); e.Code != 143 || record() != "started TERM" {
		t.Errorf("SIGTERM: %v, signals %q; want exit 143 and TERM passed on", e, record())
	}

	p = start(fake("obedient", "exit 137"))
	p.Signal(syscall.SIGKILL)
	if e := wait(p); e.Code != 137 || record() != "started INT INT" {
		t.Errorf("SIGKILL: %v, signals %q; want two SIGINTs, on which srun ends the step", e, record())
	}

	p = start(fake("deaf", ":"))
	began := time.Now()
	p.Signal(syscall.SIGKILL)
	if e := wait(p); e.Signal != syscall.SIGKILL || !strings.HasPrefix(record(), "started INT INT") {
		t.Errorf("SIGKILL to an srun that ignores it: %v, signals %q; want srun killed after SIGINTs", e, record())
	}
	if took := time.Since(began); took < 300*time.Millisecond {
		t.Errorf("srun was killed after %v, before KillAfter", took)
	}
}
