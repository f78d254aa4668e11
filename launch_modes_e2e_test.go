package kolo_test

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/jobenv"
	"github.com/kolo-dl/kolo/testbed/e2e"
	"github.com/kolo-dl/kolo/testbed/proctest"
)

// buildKolo is the kolo command built from this tree, once for the test binary.
func buildKolo(t testing.TB) string { return buildOnce(t, "./cmd/kolo") }

// launchEnv is this process's environment without any kolo job of its own. Its jobs may start
// more ranks than this machine has CPUs (KOLO_OVERSUBSCRIBE): tests start 3 to 8 on small
// machines. extra comes last, and wins.
func launchEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "KOLO_") && !strings.HasPrefix(kv, "HOROVOD_") {
			env = append(env, kv)
		}
	}
	env = append(env, jobenv.Oversubscribe+"=1")
	return append(env, extra...)
}

// launcher is one kolo run process started by a test.
type launcher struct {
	cmd            *exec.Cmd
	stdout, stderr proctest.Buffer
	start          time.Time
	done           chan struct{}
	code           int
	elapsed        time.Duration
}

func startLauncher(t *testing.T, env []string, argv ...string) *launcher {
	t.Helper()
	l := &launcher{cmd: exec.Command(argv[0], argv[1:]...), done: make(chan struct{})}
	l.cmd.Env = env
	l.cmd.Stdout, l.cmd.Stderr = &l.stdout, &l.stderr
	l.cmd.WaitDelay = 5 * time.Second
	l.start = time.Now()
	if err := l.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		l.cmd.Wait()
		l.code = l.cmd.ProcessState.ExitCode()
		if ws, ok := l.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			l.code = 128 + int(ws.Signal())
		}
		l.elapsed = time.Since(l.start)
		close(l.done)
	}()
	t.Cleanup(func() {
		select {
		case <-l.done:
		default:
			l.cmd.Process.Kill()
			<-l.done
		}
	})
	return l
}

// wait returns the exit code, failing the test if the launcher runs past timeout.
func (l *launcher) wait(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-l.done:
		return l.code
	case <-time.After(timeout):
		l.cmd.Process.Kill()
		<-l.done
		t.Fatalf("kolo run still running after %s\nstdout:\n%s\nstderr:\n%s", timeout, l.stdout.String(), l.stderr.String())
		return -1
	}
}

// waitOutput waits until stdout holds n lines matching re.
func (l *launcher) waitOutput(t *testing.T, re *regexp.Regexp, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for len(re.FindAllString(l.stdout.String(), -1)) < n {
		select {
		case <-l.done:
			t.Fatalf("kolo run ended (code %d) before %d lines matched %s\nstdout:\n%s\nstderr:\n%s", l.code, n, re, l.stdout.String(), l.stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d lines matching %s not seen within %s\nstdout:\n%s\nstderr:\n%s", n, re, timeout, l.stdout.String(), l.stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (l *launcher) output() string {
	return fmt.Sprintf("stdout:\n%s\nstderr:\n%s", l.stdout.String(), l.stderr.String())
}

var loopingLine = regexp.MustCompile(`(?m)<stdout>:looping pid=(\d+)`)

var startedLine = regexp.MustCompile(`(?m)<stdout>:started pid=(\d+) child=(\d+)`)

// sleeper is a rank that reports its pid and its child's and waits; rank fail does what failure
// says after sleeping a little.
func sleeper(failRank int, failure string) []string {
	script := `sleep 60 & echo "started pid=$$ child=$!"; `
	if failRank >= 0 {
		script += fmt.Sprintf(`if [ "$KOLO_RANK" = %d ]; then sleep 1; %s; fi; `, failRank, failure)
	}
	return []string{"/bin/sh", "-c", script + "wait"}
}

// checkNoOrphans checks, by pid, that every rank and child a job reported is gone, and that
// nothing but the sshd servers is left in the namespaces.
func checkNoOrphans(t *testing.T, ns *e2e.Netns, skip map[int]bool, outputs ...string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for _, out := range outputs {
		for _, m := range startedLine.FindAllStringSubmatch(out, -1) {
			for _, p := range m[1:] {
				pid, _ := strconv.Atoi(p)
				for proctest.Alive(pid) && time.Now().Before(deadline) {
					time.Sleep(20 * time.Millisecond)
				}
				if proctest.Alive(pid) {
					t.Errorf("process %d of a rank is still running", pid)
				}
			}
		}
	}
	for i := range ns.Names {
		var left []string
		for {
			left = ns.NamespaceProcs(i, skip)
			if len(left) == 0 || time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if len(left) > 0 {
			t.Errorf("left behind on host %d: %s", i, strings.Join(left, "; "))
		}
	}
}

// The seed scenario: three hosts whose sshd listens on port 12345, reached with -p 12345.
func TestSSHLaunch(t *testing.T) {
	hosts := e2e.NewSSHHosts(t, 3, 12345)
	kolo := buildKolo(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	a := hosts.Addrs
	run := func(t *testing.T, extraEnv []string, args ...string) *launcher {
		argv := append([]string{kolo, "run"}, hosts.SSHFlags()...)
		return startLauncher(t, launchEnv(extraEnv...), append(argv, args...)...)
	}
	sshd := hosts.SSHDPids()

	t.Run("collectives on 3 hosts", func(t *testing.T) {
		// The launcher has the bridge, the hosts only their eth0: each uses the first it has.
		l := run(t, nil, "-H", fmt.Sprintf("%s:2,%s:2,%s:2", a[0], a[1], a[2]), "--network-interface", hosts.Bridge+",eth0",
			"-x", e2e.WorkerEnv+"=ops", self, "-test.run=^$")
		if code := l.wait(t, 2*time.Minute); code != 0 {
			t.Fatalf("exit %d\n%s", code, l.output())
		}
		checkNoOrphans(t, hosts.Netns, sshd)
	})

	// Without --network-interface: the launcher listens on the address the hosts reach it at, each
	// rank on its host's address, and nothing on every interface.
	t.Run("listens on the hosts' network", func(t *testing.T) {
		l := run(t, nil, "-H", fmt.Sprintf("%s:1,%s:1", a[0], a[1]), "-x", e2e.WorkerEnv+"=loop", self, "-test.run=^$")
		l.waitOutput(t, loopingLine, 2, time.Minute)
		want := map[int][]string{l.cmd.Process.Pid: {hosts.Gateway}}
		for _, m := range loopingLine.FindAllStringSubmatch(l.stdout.String(), -1) {
			pid, _ := strconv.Atoi(m[1])
			want[pid] = []string{a[0], a[1]}
		}
		for pid, ips := range want {
			addrs, err := listeningAddrs(pid)
			if err != nil {
				t.Fatal(err)
			}
			if len(addrs) == 0 {
				t.Errorf("process %d listens nowhere", pid)
			}
			for _, addr := range addrs {
				if !slices.Contains(ips, addr.IP.String()) {
					t.Errorf("process %d listens on %s, want only on %v (all: %v)", pid, addr, ips, addrs)
				}
			}
		}
		l.cmd.Process.Signal(os.Interrupt)
		if code := l.wait(t, 20*time.Second); code != 130 {
			t.Errorf("exit %d after Ctrl-C, want 130\n%s", code, l.output())
		}
		checkNoOrphans(t, hosts.Netns, sshd, l.stdout.String())
	})

	t.Run("environment, directory and secret", func(t *testing.T) {
		// The secret is looked for through a pattern file so that grep's own command line does
		// not hold it.
		script := `f=$(mktemp); printf %s "$KOLO_SECRET" > "$f"; ` +
			`if grep -qaFf "$f" /proc/[0-9]*/cmdline 2>/dev/null; then leak=yes; else leak=no; fi; rm -f "$f"; ` +
			`echo "rank=$KOLO_RANK host=$(hostname) kolohost=$KOLO_HOSTNAME pwd=$(pwd) x=$BY_X lo=${LAUNCHER_ONLY-unset} cvd=${CUDA_VISIBLE_DEVICES-unset} secret=${#KOLO_SECRET} leak=$leak rv=$KOLO_RENDEZVOUS_ADDR"`
		// 12 ranks on host 1: more ssh sessions at once than sshd's default MaxStartups (10) admits.
		// A variable set only in the launching shell reaches every rank, as with horovodrun; a
		// per-host one (each host has its own GPUs) does not.
		l := run(t, []string{"BY_X=forwarded", "LAUNCHER_ONLY=1", "CUDA_VISIBLE_DEVICES=7"}, "-H", fmt.Sprintf("%s:1,%s:12", a[0], a[1]), "-x", "BY_X", "/bin/sh", "-c", script)
		if code := l.wait(t, time.Minute); code != 0 {
			t.Fatalf("exit %d\n%s", code, l.output())
		}
		wd, _ := os.Getwd()
		for r := 0; r < 13; r++ {
			h := min(r, 1)
			want := fmt.Sprintf("rank=%d host=%s kolohost=%s pwd=%s x=forwarded lo=1 cvd=unset secret=64 leak=no rv=%s:", r, hosts.Hostnames[h], a[h], wd, hosts.Gateway)
			if !strings.Contains(l.stdout.String(), want) {
				t.Errorf("rank %d: want %q in\n%s", r, want, l.output())
			}
		}
	})

	t.Run("rank exits 7", func(t *testing.T) {
		l := run(t, nil, append([]string{"-H", fmt.Sprintf("%s:1,%s:2,%s:1", a[0], a[1], a[2])},
			sleeper(2, `echo "rank 2 gives up: bad batch" >&2; exit 7`)...)...)
		l.waitOutput(t, startedLine, 4, 30*time.Second)
		failedAt := time.Now()
		if code := l.wait(t, 30*time.Second); code != 7 {
			t.Fatalf("exit %d, want 7\n%s", code, l.output())
		}
		if d := time.Since(failedAt); d > 6*time.Second {
			t.Errorf("launcher exited %s after the rank failed", d)
		}
		summary := l.stderr.String()
		head := fmt.Sprintf("kolo run: rank 2 on %s exited with code 7 (the first rank to fail).\nLast lines of rank 2's stderr:\n    rank 2 gives up: bad batch\n", a[1])
		if !strings.Contains(summary, head) || strings.Index(summary, head) > strings.Index(summary, "Other ranks:") {
			t.Errorf("summary does not lead with rank 2's failure and stderr:\n%s", summary)
		}
		checkNoOrphans(t, hosts.Netns, sshd, l.stdout.String())
	})

	t.Run("rank killed by a signal", func(t *testing.T) {
		l := run(t, nil, append([]string{"-H", fmt.Sprintf("%s:1,%s:1", a[0], a[2])}, sleeper(1, `kill -KILL $$`)...)...)
		if code := l.wait(t, 30*time.Second); code != 137 {
			t.Fatalf("exit %d, want 137\n%s", code, l.output())
		}
		if want := fmt.Sprintf("rank 1 on %s killed by signal 9", a[2]); !strings.Contains(l.stderr.String(), want) {
			t.Errorf("summary lacks %q:\n%s", want, l.stderr.String())
		}
		checkNoOrphans(t, hosts.Netns, sshd, l.stdout.String())
	})

	t.Run("Ctrl-C", func(t *testing.T) {
		l := run(t, nil, append([]string{"-H", fmt.Sprintf("%s:2,%s:1,%s:1", a[0], a[1], a[2])}, sleeper(-1, "")...)...)
		l.waitOutput(t, startedLine, 4, 30*time.Second)
		l.cmd.Process.Signal(os.Interrupt)
		if code := l.wait(t, 10*time.Second); code != 130 {
			t.Fatalf("exit %d, want 130\n%s", code, l.output())
		}
		checkNoOrphans(t, hosts.Netns, sshd, l.stdout.String())
	})

	t.Run("launcher killed", func(t *testing.T) {
		l := run(t, nil, append([]string{"-H", fmt.Sprintf("%s:1,%s:1,localhost:1", a[0], a[1])}, sleeper(-1, "")...)...)
		l.waitOutput(t, startedLine, 3, 30*time.Second)
		l.cmd.Process.Kill()
		l.wait(t, 5*time.Second)
		checkNoOrphans(t, hosts.Netns, sshd, l.stdout.String())
	})

	t.Run("unreachable host", func(t *testing.T) {
		nobody := hosts.Gateway[:strings.LastIndexByte(hosts.Gateway, '.')+1] + "99"
		l := run(t, nil, "--start-timeout", "3s", "-H", fmt.Sprintf("%s:1,%s:1", a[0], nobody), "true")
		code := l.wait(t, 15*time.Second)
		if code == 0 || l.elapsed > 6*time.Second {
			t.Errorf("exit %d after %s: want an error within --start-timeout", code, l.elapsed)
		}
		if want := fmt.Sprintf("host %s: ssh (port 12345) failed: ssh: connect to host %s port 12345:", nobody, nobody); !strings.Contains(l.stderr.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, l.stderr.String())
		}
		if strings.Contains(l.stderr.String(), "host "+a[0]+":") {
			t.Errorf("the reachable host is reported:\n%s", l.stderr.String())
		}
	})

	t.Run("host refuses the key", func(t *testing.T) {
		argv := append([]string{kolo, "run"}, hosts.SSHFlags()...)
		for i := range argv {
			if argv[i] == hosts.Key {
				argv[i] = hosts.OtherKey
			}
		}
		argv = append(argv, "-H", fmt.Sprintf("%s:1", a[1]), "true")
		l := startLauncher(t, launchEnv(), argv...)
		if code := l.wait(t, 15*time.Second); code == 0 {
			t.Fatalf("exit 0 with a refused key\n%s", l.output())
		}
		if want := fmt.Sprintf("host %s: ssh (port 12345) failed: root@%s: Permission denied (publickey", a[1], a[1]); !strings.Contains(l.stderr.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, l.stderr.String())
		}
	})
}

// The same jobs with no ssh: every namespace host runs kolo run itself (with a host name of its
// own) and they meet at host 0's rendezvous.
func TestNoSSHLaunch(t *testing.T) {
	ns := e2e.NewNetns(t, 3)
	if _, err := exec.LookPath("unshare"); err != nil {
		e2e.Unavailable(t, "no unshare (util-linux)")
	}
	kolo := buildKolo(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	env := launchEnv("KOLO_SECRET=0123456789abcdef0123456789abcdef")
	port := 29400
	// nodes starts kolo run with args on every host, each under a host name of its own.
	nodes := func(t *testing.T, args ...string) []*launcher {
		port++ // a fresh rendezvous per job
		ls := make([]*launcher, len(ns.Names))
		for i, name := range ns.Names {
			argv := append([]string{kolo, "run", "--rendezvous", fmt.Sprintf("%s:%d", ns.Addrs[0], port),
				"--nnodes", "3", "--node-rank", strconv.Itoa(i), "--network-interface", "eth0", "--start-timeout", "20s"}, args...)
			for j, a := range argv {
				argv[j] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
			}
			ls[i] = startLauncher(t, env, "ip", "netns", "exec", name, "unshare", "--uts", "sh", "-c",
				fmt.Sprintf("hostname node%d && exec %s", i, strings.Join(argv, " ")))
		}
		return ls
	}
	outputs := func(ls []*launcher) []string {
		var o []string
		for _, l := range ls {
			o = append(o, l.stdout.String())
		}
		return o
	}

	t.Run("collectives on 3 nodes", func(t *testing.T) {
		ls := nodes(t, "-np", "6", "-x", e2e.WorkerEnv+"=ops", self, "-test.run=^$")
		for i, l := range ls {
			if code := l.wait(t, 2*time.Minute); code != 0 {
				t.Errorf("node %d: exit %d\n%s", i, code, l.output())
			}
		}
		checkNoOrphans(t, ns, nil)
	})

	t.Run("rank exits 7", func(t *testing.T) {
		ls := nodes(t, append([]string{"--nproc-per-node", "2"}, sleeper(5, `echo "rank 5 gives up" >&2; exit 7`)...)...)
		for _, l := range ls {
			l.waitOutput(t, startedLine, 2, 30*time.Second)
		}
		failedAt := time.Now()
		for i, l := range ls {
			if code := l.wait(t, 30*time.Second); code != 7 {
				t.Errorf("node %d: exit %d, want 7\n%s", i, code, l.output())
			}
			if !strings.Contains(l.stderr.String(), "kolo run: rank 5 on node2 exited with code 7 (the first rank to fail).\nLast lines of rank 5's stderr:\n    rank 5 gives up\n") {
				t.Errorf("node %d's summary does not lead with rank 5:\n%s", i, l.stderr.String())
			}
		}
		if d := time.Since(failedAt); d > 7*time.Second {
			t.Errorf("nodes exited %s after the rank failed", d)
		}
		checkNoOrphans(t, ns, nil, outputs(ls)...)
	})

	t.Run("Ctrl-C on one node", func(t *testing.T) {
		ls := nodes(t, append([]string{"--nproc-per-node", "1"}, sleeper(-1, "")...)...)
		for _, l := range ls {
			l.waitOutput(t, startedLine, 1, 30*time.Second)
		}
		ls[1].cmd.Process.Signal(os.Interrupt)
		for i, l := range ls {
			if code := l.wait(t, 20*time.Second); code != 130 {
				t.Errorf("node %d: exit %d, want 130\n%s", i, code, l.output())
			}
		}
		checkNoOrphans(t, ns, nil, outputs(ls)...)
	})

	// A node vanishing mid-job (its launcher and ranks killed, as when a container dies): the
	// others' ranks fail on the lost peers, and the serving node must not then wait out the full
	// heartbeat silence before ending the job.
	t.Run("worker node lost", func(t *testing.T) {
		ls := nodes(t, "--nproc-per-node", "1", "-x", e2e.WorkerEnv+"=loop", self, "-test.run=^$")
		for _, l := range ls {
			l.waitOutput(t, loopingLine, 1, 30*time.Second)
		}
		pids := loopingLine.FindAllStringSubmatch(ls[1].stdout.String(), -1)
		killedAt := time.Now()
		ls[1].cmd.Process.Kill()
		if len(pids) == 1 {
			pid, _ := strconv.Atoi(pids[0][1])
			syscall.Kill(pid, syscall.SIGKILL)
		}
		for _, i := range []int{0, 2} {
			l := ls[i]
			if code := l.wait(t, 20*time.Second); code == 0 {
				t.Errorf("node %d: exit 0 after node 1 was killed\n%s", i, l.output())
			}
			if !strings.Contains(l.stderr.String(), "node1") {
				t.Errorf("node %d does not name the lost host node1:\n%s", i, l.stderr.String())
			}
		}
		if d := time.Since(killedAt); d > 8*time.Second {
			t.Errorf("the job ended %s after node 1 was killed, want < 8 s", d)
		}
		checkNoOrphans(t, ns, nil)
	})

	t.Run("rendezvous host lost", func(t *testing.T) {
		ls := nodes(t, append([]string{"--nproc-per-node", "1"}, sleeper(-1, "")...)...)
		for _, l := range ls {
			l.waitOutput(t, startedLine, 1, 30*time.Second)
		}
		ls[0].cmd.Process.Kill()
		for i, l := range ls[1:] {
			code := l.wait(t, 10*time.Second)
			if code == 0 || !strings.Contains(l.stderr.String(), "lost the rendezvous at "+ns.Addrs[0]) {
				t.Errorf("node %d: exit %d, want a failure naming the lost rendezvous\n%s", i+1, code, l.output())
			}
		}
		checkNoOrphans(t, ns, nil, outputs(ls)...)
	})
}
