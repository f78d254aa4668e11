package proc

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/testbed/proctest"
)

// groupLeader starts `sleep 30` leading its own process group, as LocalStarter starts a rank.
func groupLeader(t *testing.T) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sleep", "30")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
	})
	return cmd
}

// die ends the guard's input without a goodbye, as the launcher's death does, and waits until the
// guard has done what it does then.
func (g *OrphanGuard) die() {
	g.mu.Lock()
	g.closed = true
	g.w.Close()
	g.mu.Unlock()
	g.cmd.Wait()
}

func TestOrphanGuard(t *testing.T) {
	tests := []struct {
		name       string
		run        func(g *OrphanGuard, a, b int) // a and b: two groups the guard was told of
		wantKilled [2]bool
	}{
		{"launcher dies: every group is killed", func(g *OrphanGuard, a, b int) { g.die() }, [2]bool{true, true}},
		{"launcher says goodbye: nothing is killed", func(g *OrphanGuard, a, b int) {
			if err := g.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		}, [2]bool{false, false}},
		{"a removed group is never killed", func(g *OrphanGuard, a, b int) { g.Remove(a); g.die() }, [2]bool{false, true}},
		{"removing an unknown group changes nothing", func(g *OrphanGuard, a, b int) { g.Remove(1); g.die() }, [2]bool{true, true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g, err := StartOrphanGuard()
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			a, b := groupLeader(t), groupLeader(t)
			g.Add(a.Process.Pid)
			g.Add(b.Process.Pid)
			tc.run(g, a.Process.Pid, b.Process.Pid)
			// The guard has exited, so it has sent every kill it was going to send; a SIGKILL
			// still takes a moment to land.
			for i, c := range []*exec.Cmd{a, b} {
				wait := 100 * time.Millisecond // for a kill that should not come
				if tc.wantKilled[i] {
					wait = 5 * time.Second
				}
				deadline := time.Now().Add(wait)
				for proctest.Alive(c.Process.Pid) && time.Now().Before(deadline) {
					time.Sleep(10 * time.Millisecond)
				}
				if killed := !proctest.Alive(c.Process.Pid); killed != tc.wantKilled[i] {
					t.Errorf("group %d killed = %v, want %v", i, killed, tc.wantKilled[i])
				}
			}
		})
	}
}

// A nil guard (sh could not be started) is a no-op, not a crash.
func TestOrphanGuardNil(t *testing.T) {
	var g *OrphanGuard
	g.Add(1)
	g.Remove(1)
	if err := g.Close(); err != nil {
		t.Errorf("Close of a nil guard: %v", err)
	}
}

// The guarantee itself: a launcher killed outright (SIGKILL: no cleanup) takes with it what its ranks
// started. The launcher here is this test binary, re-run as TestOrphanGuardHelperLauncher.
func TestOrphanGuardOutlivesKilledLauncher(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	launcher := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestOrphanGuardHelperLauncher$")
	launcher.Env = append(os.Environ(), "KOLO_TEST_GUARD_LAUNCHER=1")
	out, err := launcher.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := launcher.Start(); err != nil {
		t.Fatal(err)
	}
	defer launcher.Wait()
	defer launcher.Process.Kill()
	var pids []int
	sc := bufio.NewScanner(out)
	for len(pids) == 0 && sc.Scan() {
		pids = proctest.ChildPids(sc.Text())
	}
	if len(pids) != 1 {
		t.Fatalf("the rank never said which child it started (%v)", sc.Err())
	}
	t.Cleanup(func() { syscall.Kill(pids[0], syscall.SIGKILL) }) // should the guard fail
	launcher.Process.Signal(syscall.SIGKILL)
	proctest.AwaitGone(t, pids)
}

func TestOrphanGuardHelperLauncher(t *testing.T) {
	if os.Getenv("KOLO_TEST_GUARD_LAUNCHER") != "1" {
		t.Skip("run by TestOrphanGuardOutlivesKilledLauncher")
	}
	guard, err := StartOrphanGuard()
	if err != nil {
		t.Fatal(err)
	}
	r := &Runner{Starter: LocalStarter{Guard: guard}, Stdout: os.Stdout, Stderr: os.Stderr}
	// The rank's child is in the rank's process group; the kernel kills only the rank itself
	// (Pdeathsig) when the launcher dies.
	r.Run(context.Background(), shWorkers(`sleep 60 & echo child=$!; wait`)) // until the test kills this process
	t.Error("the rank ended on its own")
}

// The guard runs its follow-up only after killing a dead launcher's groups, once their
// processes no longer run (the leader here is this test's unreaped child, a zombie: gone, not
// waited for), never on a goodbye.
func TestOrphanGuardThen(t *testing.T) {
	for _, dies := range []bool{true, false} {
		mark := t.TempDir() + "/ran"
		a := groupLeader(t)
		// The follow-up writes the leader's state as /proc shows it: "Z" (or nothing) once it is gone.
		g, err := StartOrphanGuard("sh", "-c", `l=$(cat /proc/$0/stat 2>/dev/null); l=${l##*) }; echo "ran ${l%% *}" > "$1"`,
			strconv.Itoa(a.Process.Pid), mark)
		if err != nil {
			t.Fatal(err)
		}
		g.Add(a.Process.Pid)
		if dies {
			g.die()
		} else if err := g.Close(); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(mark)
		if ran := err == nil; ran != dies {
			t.Errorf("launcher died %v: follow-up ran %v", dies, ran)
		}
		if got := strings.TrimSpace(string(b)); dies && got != "ran Z" && got != "ran" {
			t.Errorf("the follow-up ran while the killed group's leader still ran: %q", got)
		}
	}
}

// The guard removes the directory it was given only after killing a dead launcher's groups,
// never on a goodbye (the launcher removes it then).
func TestOrphanGuardRemovesDir(t *testing.T) {
	for _, dies := range []bool{true, false} {
		dir := t.TempDir() + "/job sockets"
		if err := os.MkdirAll(dir+"/sub", 0o700); err != nil {
			t.Fatal(err)
		}
		g, err := StartOrphanGuard()
		if err != nil {
			t.Fatal(err)
		}
		g.Add(groupLeader(t).Process.Pid)
		g.RemoveAfterOrphans(dir)
		if dies {
			g.die()
		} else if err := g.Close(); err != nil {
			t.Fatal(err)
		}
		_, err = os.Stat(dir)
		if removed := os.IsNotExist(err); removed != dies {
			t.Errorf("launcher died %v: directory removed %v (stat: %v)", dies, removed, err)
		}
	}
}
