package kolo_test

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestStartupKillsLeaveNothing kills kolo run or one of its ranks at a random moment of start-up
// (100 trials: SIGKILL, SIGINT or SIGTERM to the launcher, SIGKILL to a rank) and finds /dev/shm
// and the job's temp directory as they were once everything has ended: no shared-memory segment
// is left by a rank that died between creating its host's segment and every rank attaching.
func TestStartupKillsLeaveNothing(t *testing.T) {
	trials := 100
	if testing.Short() {
		trials = 20
	}
	kolo, softmax := buildKolo(t), buildSoftmax(t)
	rng := rand.New(rand.NewPCG(2026, 28))
	for trial := range trials {
		before := staleSegments(t)
		tmp := t.TempDir()
		np := 2 + rng.IntN(2)
		cmd := exec.Command(kolo, "run", "-np", strconv.Itoa(np), softmax, "-steps", "100000")
		cmd.Env = append(launchEnv(), "TMPDIR="+tmp)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(rng.IntN(400)) * time.Millisecond)
		victim, sig := cmd.Process.Pid, []syscall.Signal{syscall.SIGKILL, syscall.SIGINT, syscall.SIGTERM, 0}[rng.IntN(4)]
		what := fmt.Sprintf("launcher %v", sig)
		if sig == 0 {
			sig = syscall.SIGKILL
			if ranks := ranksOf(cmd.Process.Pid, softmax); len(ranks) > 0 {
				victim = ranks[rng.IntN(len(ranks))]
				what = "a rank SIGKILL"
			} else {
				what = "launcher SIGKILL (no rank yet)"
			}
		}
		all := append(ranksOf(cmd.Process.Pid, softmax), cmd.Process.Pid)
		syscall.Kill(victim, sig)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			t.Fatalf("trial %d (%s): kolo run did not end within 30 s", trial, what)
		}
		// Every process of the job ends (a killed launcher's orphan guard kills its ranks, then
		// sweeps); ranks started after the last look are the launcher's children too.
		deadline := time.Now().Add(15 * time.Second)
		for _, p := range all {
			for syscall.Kill(p, 0) == nil && !zombie(p) && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
		}
		// A killed launcher's guard sweeps once the ranks it killed are reaped: give it until a
		// deadline, which a leak never meets.
		var left []string
		var ents []os.DirEntry
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			left = newOnly(staleSegments(t), before)
			ents, _ = os.ReadDir(tmp)
			if len(left) == 0 && len(ents) == 0 || time.Now().After(deadline) {
				break
			}
		}
		if len(left) > 0 {
			t.Errorf("trial %d (%d ranks, %s after start-up began): left %v in /dev/shm", trial, np, what, left)
		}
		if len(ents) > 0 {
			t.Errorf("trial %d (%s): left %d files in the job's TMPDIR", trial, what, len(ents))
		}
	}
}

// staleSegments lists /dev/shm's kolo segments whose creator is gone: left behind. (A segment
// whose creator runs belongs to a job still starting, here or in another test.)
func staleSegments(t *testing.T) []string {
	ents, err := os.ReadDir("/dev/shm")
	if err != nil {
		t.Skipf("no /dev/shm: %v", err)
	}
	var out []string
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), "kolo-") {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/dev/shm", e.Name()))
		if err != nil {
			continue // removed meanwhile
		}
		// The header's creator pid (internal/transport/shm's layout: offset 48, little-endian).
		if len(b) >= 56 {
			if pid := int(binary.LittleEndian.Uint64(b[48:])); pid > 0 && syscall.Kill(pid, 0) == nil && !zombie(pid) {
				continue
			}
		}
		out = append(out, e.Name())
	}
	return out
}

func newOnly(after, before []string) []string {
	var out []string
	for _, a := range after {
		if !slices.Contains(before, a) {
			out = append(out, filepath.Join("/dev/shm", a))
		}
	}
	return out
}

// ranksOf is the processes under pid that run binary.
func ranksOf(pid int, binary string) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", p))
		if err != nil || exe != binary {
			continue
		}
		for q := p; q > 1; {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", q))
			if err != nil {
				break
			}
			f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
			if q, _ = strconv.Atoi(f[1]); q == pid {
				out = append(out, p)
				break
			}
		}
	}
	return out
}

func zombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	return len(f) > 0 && f[0] == "Z"
}
