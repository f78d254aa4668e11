//go:build linux

package shm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"
)

// startCreator starts local rank 0 of a group of size in a child process, which creates the
// segment and waits for the others, and returns once the segment has its name.
func startCreator(t *testing.T, size int) (*exec.Cmd, Config) {
	t.Helper()
	cfg := Config{Name: fmt.Sprintf("kolo-sweep-test-%d-%d", os.Getpid(), segCounter.Add(1)), Dir: t.TempDir(),
		Size: size, Timeout: 20 * time.Second}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envChild+"=barrier", envDir+"="+cfg.Dir, envName+"="+cfg.Name,
		envRank+"=0", envSize+"="+strconv.Itoa(size), envIters+"=1")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	path := filepath.Join(cfg.Dir, cfg.Name)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		if _, err := os.Stat(path); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("rank 0 did not create %s", path)
		}
	}
	return cmd, cfg
}

func kill(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	cmd.Process.Kill()
	cmd.Wait()
}

// A segment's name appears with its header complete, so a sweeper can always tell who made it.
func TestSegmentIsNamedComplete(t *testing.T) {
	_, cfg := startCreator(t, 2)
	b, err := os.ReadFile(filepath.Join(cfg.Dir, cfg.Name))
	if err != nil {
		t.Fatal(err)
	}
	if len(b) < globalBytes || *u32(b, offReady) != headerReadyMarker || *u64(b, offCreatorPid) == 0 {
		t.Fatalf("the segment had its name before its header was complete (%d bytes)", len(b))
	}
}

func TestSweepRemovesOnlyStaleSegments(t *testing.T) {
	dead, deadCfg := startCreator(t, 2)
	_, liveCfg := startCreator(t, 2)
	kill(t, dead)
	dir := t.TempDir()
	for _, c := range []Config{deadCfg, liveCfg} { // both in one directory
		if err := os.Rename(filepath.Join(c.Dir, c.Name), filepath.Join(dir, c.Name)); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(dir, SegmentPrefix+"not-a-segment"), []byte("hello"), 0o600)
	os.WriteFile(filepath.Join(dir, "other-file"), make([]byte, 8192), 0o600)
	removed, err := Sweep(dir)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{filepath.Join(dir, deadCfg.Name)}; !slices.Equal(removed, want) {
		t.Fatalf("removed %v, want %v", removed, want)
	}
	left, _ := os.ReadDir(dir)
	var names []string
	for _, e := range left {
		names = append(names, e.Name())
	}
	if want := []string{liveCfg.Name, SegmentPrefix + "not-a-segment", "other-file"}; !slices.Equal(slices.Sorted(slices.Values(names)), slices.Sorted(slices.Values(want))) {
		t.Errorf("left %v, want %v", names, want)
	}
}

// Rank 0 killed while the others attach: whichever local rank finds it gone removes the segment,
// whether it had attached already or arrives after the death.
func TestRankRemovesSegmentOfDeadCreator(t *testing.T) {
	for _, attachFirst := range []bool{true, false} {
		t.Run(fmt.Sprintf("attached_first=%v", attachFirst), func(t *testing.T) {
			creator, cfg := startCreator(t, 3)
			cfg.Rank = 1
			path := filepath.Join(cfg.Dir, cfg.Name)
			done := make(chan error, 1)
			if attachFirst {
				go func() { _, err := Open(context.Background(), cfg); done <- err }()
				time.Sleep(200 * time.Millisecond) // attached, waiting for rank 2
				kill(t, creator)
			} else {
				kill(t, creator)
				go func() { _, err := Open(context.Background(), cfg); done <- err }()
			}
			select {
			case err := <-done:
				if err == nil {
					t.Fatal("Open succeeded without rank 0")
				}
				t.Logf("rank 1: %v", err)
			case <-time.After(10 * time.Second):
				t.Fatal("rank 1 did not notice rank 0's death")
			}
			if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("segment left behind: %v", err)
			}
		})
	}
}

// Rank 0 of the next job on the host removes what a job that died in start-up left.
func TestNextJobSweeps(t *testing.T) {
	dead, cfg := startCreator(t, 2)
	kill(t, dead)
	stale := filepath.Join(cfg.Dir, cfg.Name)
	cfg.Name += "-next"
	cfg.Size = 1
	g, err := Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	g.Close()
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the dead job's segment is still there: %v", err)
	}
}
