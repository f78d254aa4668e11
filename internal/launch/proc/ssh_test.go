package proc

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/launch/layout"
	"github.com/kolo-dl/kolo/testbed/proctest"
)

func TestForwardedEnv(t *testing.T) {
	env := []string{
		"PATH=/bin", "HOME=/root", "KOLO_RANK=1", "HOROVOD_RANK=1", "NCCL_SOCKET_IFNAME=eth1", "FOO=1",
		"PYTHONPATH=/p", "LD_LIBRARY_PATH=/l", "BASH_FUNC_f%%=() { :; }", "BASH_FUNC_g=x", "KOLO_RANK=2",
		"BAR=2", "noequals", "OLDPWD=/tmp", "PWD=/work", "CUDA_VISIBLE_DEVICES=0,1",
		"NVIDIA_CUDA_VISIBLE_DEVICES_X=1", "HOROVOD_SECRET_KEY=s", "KOLO_SECRET=k", "SSH_CONNECTION=a b",
		"HOSTNAME=node0", "SHLVL=2", "not-a-name=1", "OMP_NUM_THREADS=4",
	}
	cases := []struct {
		name  string
		extra []string
		want  []string
	}{
		{"everything but per-host names", nil, []string{
			"PATH=/bin", "HOME=/root", "KOLO_RANK=2", "HOROVOD_RANK=1", "NCCL_SOCKET_IFNAME=eth1", "FOO=1",
			"PYTHONPATH=/p", "LD_LIBRARY_PATH=/l", "BAR=2", "KOLO_SECRET=k", "OMP_NUM_THREADS=4",
		}},
		{"-x forwards a per-host name", []string{"CUDA_VISIBLE_DEVICES", "FOO=override-is-already-in-env"}, []string{
			"PATH=/bin", "HOME=/root", "KOLO_RANK=2", "HOROVOD_RANK=1", "NCCL_SOCKET_IFNAME=eth1", "FOO=1",
			"PYTHONPATH=/p", "LD_LIBRARY_PATH=/l", "BAR=2", "CUDA_VISIBLE_DEVICES=0,1", "KOLO_SECRET=k",
			"OMP_NUM_THREADS=4",
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := ForwardedEnv(env, c.extra); !reflect.DeepEqual(got, c.want) {
				t.Errorf("ForwardedEnv:\n got %q\nwant %q", got, c.want)
			}
		})
	}
}

// fakeSSH stands in for ssh: it records its arguments, skips the options, fails for hosts named
// unreachable*, refuses hosts named refusing* always and starting-N* the first N times it is
// asked, and runs the remote command with sh, as sshd would with the user's login shell.
func fakeSSH(t *testing.T) (program, argsLog string) {
	t.Helper()
	dir := t.TempDir()
	argsLog = filepath.Join(dir, "args")
	program = filepath.Join(dir, "ssh")
	script := `#!/bin/sh
printf '%s\n' "$*" >> ` + shellQuote(argsLog) + `
while [ $# -gt 0 ]; do
  case $1 in -T) shift ;; -o|-p|-i) shift 2 ;; --) shift; break ;; *) break ;; esac
done
host=$1; shift
case $host in
unreachable*) echo "ssh: connect to host $host port 22: No route to host" >&2; exit 255 ;;
refusing*) echo "ssh: connect to host $host port 22: Connection refused" >&2; exit 255 ;;
starting-*)
  n=${host#starting-}; n=${n%%[!0-9]*}
  count=` + shellQuote(dir) + `/tries-$host
  echo x >> "$count"
  if [ "$(wc -l < "$count")" -le "$n" ]; then echo "ssh: connect to host $host port 22: Connection refused" >&2; exit 255; fi ;;
esac
exec sh -c "$1"
`
	if err := os.WriteFile(program, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return program, argsLog
}

func sshWorkers(dir string, env []string, scripts ...string) []Worker {
	ws := make([]Worker, len(scripts))
	for i, s := range scripts {
		ws[i] = Worker{
			Slot: layout.Slot{Rank: i, Size: len(scripts), Host: "remote" + strconv.Itoa(i), LocalSize: 1, CrossRank: i, CrossSize: len(scripts)},
			Argv: []string{"/bin/sh", "-c", s},
			Env:  env,
			Dir:  dir,
		}
	}
	return ws
}

func TestSSHStarterEnvDirAndArgs(t *testing.T) {
	prog, argsLog := fakeSSH(t)
	dir := t.TempDir()
	s := &SSHStarter{Program: prog, Port: 2222, IdentityFile: "/keys/id", Options: []string{"StrictHostKeyChecking=accept-new"},
		ConnectTimeout: 3 * time.Second, Forward: []string{"FOO"}}
	env := []string{"PATH=" + os.Getenv("PATH"), "KOLO_SECRET=s3cr3t-value", "FOO=it's \"quoted\"\nand two lines", "SET_IN_SHELL=1", "SSH_CONNECTION=per host", "KOLO_RANK=0"}
	var out, errOut proctest.Buffer
	r := &Runner{Starter: s, Stdout: &out, Stderr: &errOut}
	_, first := r.Run(context.Background(), sshWorkers(dir, env,
		`echo "pwd=$(pwd) rank=$KOLO_RANK secret=$KOLO_SECRET shell=${SET_IN_SHELL-unset} sshc=${SSH_CONNECTION-unset}"; printf 'foo=%s|\n' "$FOO"; echo to-stderr >&2`))
	if first != nil {
		t.Fatalf("failed: %v\n%s", first.Exit, errOut.String())
	}
	for _, want := range []string{"pwd=" + dir + " rank=0 secret=s3cr3t-value shell=1 sshc=unset", "foo=it's \"quoted\"", "[0]<stdout>:and two lines|"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("stdout lacks %q:\n%s", want, out.String())
		}
	}
	if errOut.String() != "[0]<stderr>:to-stderr\n" {
		t.Errorf("stderr = %q, want only the program's line (no marker, no shell noise)", errOut.String())
	}
	args, _ := os.ReadFile(argsLog)
	for _, want := range []string{"-T -o BatchMode=yes -o ConnectTimeout=3 -p 2222 -i /keys/id -o StrictHostKeyChecking=accept-new -- remote0 sh -c"} {
		if !strings.Contains(string(args), want) {
			t.Errorf("ssh arguments %q lack %q", args, want)
		}
	}
	if strings.Contains(string(args), "s3cr3t") {
		t.Errorf("the secret is on ssh's command line: %q", args)
	}
}

func TestSSHStarterFailureStopsOthers(t *testing.T) {
	prog, _ := fakeSSH(t)
	var out, errOut proctest.Buffer
	r := &Runner{Starter: &SSHStarter{Program: prog}, Stdout: &out, Stderr: &errOut, GracePeriod: 500 * time.Millisecond}
	start := time.Now()
	results, first := r.Run(context.Background(), sshWorkers("/", os.Environ(),
		`sleep 0.3; echo "rank 0 gives up" >&2; exit 7`,
		`trap '' TERM; sleep 30 & echo child=$!; wait; wait`, // ignores TERM: needs the KILL
		`sleep 30 & echo child=$!; wait`,
	))
	if first == nil || first.Slot.Rank != 0 || first.Exit.Code != 7 {
		t.Fatalf("first failure %+v, want rank 0 with code 7", first)
	}
	if !reflect.DeepEqual(first.StderrTail, []string{"rank 0 gives up"}) {
		t.Errorf("tail %q", first.StderrTail)
	}
	if !results[1].Stopped || results[1].Exit.Signal != syscall.SIGKILL {
		t.Errorf("rank 1 ignoring TERM: %+v, want stopped with SIGKILL", results[1])
	}
	if !results[2].Stopped || results[2].Exit.Signal != syscall.SIGTERM {
		t.Errorf("rank 2: %+v, want stopped with SIGTERM", results[2])
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("took %s to stop", el)
	}
	pids := proctest.ChildPids(out.String())
	if len(pids) != 2 {
		t.Fatalf("want 2 child pids in %q", out.String())
	}
	proctest.AwaitGone(t, pids)
}

func TestSSHStarterSignalAndConnectionFailure(t *testing.T) {
	prog, _ := fakeSSH(t)
	// Rank 0 dies a moment later than rank 1's connection fails: the other way round, the runner
	// could stop rank 1 before its ssh said why (under load it did).
	ws := sshWorkers("/", os.Environ(), `sleep 1; kill -9 $$`, `sleep 30`)
	ws[1].Slot.Host = "unreachable-host"
	var errOut proctest.Buffer
	results, _ := (&Runner{Starter: &SSHStarter{Program: prog}, Stderr: &errOut}).Run(context.Background(), ws)
	// Each must say how it ended (rank 0 killed, or stopped once rank 1 failed).
	if e := results[0].Exit; e.Signal != syscall.SIGKILL && !results[0].Stopped {
		t.Errorf("rank 0 killed by signal 9: got %+v", e)
	}
	e := results[1].Exit
	if e.Err == nil || !strings.Contains(e.Err.Error(), "No route to host") || !strings.Contains(e.Err.Error(), "unreachable-host") || e.Code != 255 {
		t.Errorf("rank 1 on an unreachable host: got %+v", e)
	}
}

// When the launcher goes away (ssh's stdin ends), the remote side kills everything it started.
func TestSSHStarterEndOfInputKillsGroup(t *testing.T) {
	prog, _ := fakeSSH(t)
	s := &SSHStarter{Program: prog}
	p, err := s.Start(context.Background(), sshWorkers("/", os.Environ(), `sleep 30 & echo child=$!; wait`)[0])
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	n, _ := p.Stdout().Read(buf)
	pids := proctest.ChildPids(string(buf[:n]))
	if len(pids) != 1 {
		t.Fatalf("no child pid in %q", buf[:n])
	}
	p.(*sshProcess).stdin.Close()
	done := make(chan Exit, 1)
	go func() { done <- p.Wait() }()
	select {
	case e := <-done:
		if e.Signal != syscall.SIGKILL {
			t.Errorf("exit %+v, want killed by SIGKILL", e)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the worker outlived the end of its input")
	}
	proctest.AwaitGone(t, pids)
}

func TestSSHCheck(t *testing.T) {
	prog, _ := fakeSSH(t)
	s := &SSHStarter{Program: prog, Port: 12345}
	if err := s.Check(context.Background(), []string{"a", "b"}); err != nil {
		t.Fatalf("reachable hosts: %v", err)
	}
	err := s.Check(context.Background(), []string{"a", "unreachable-9"})
	if err == nil || !strings.Contains(err.Error(), "host unreachable-9: ssh (port 12345) failed: ssh: connect to host unreachable-9 port 22: No route to host") {
		t.Errorf("got %v", err)
	}
	if err != nil && strings.Contains(err.Error(), "host a:") {
		t.Errorf("reachable host reported: %v", err)
	}
	// A working directory the host does not have.
	s.Dir = "/nonexistent/kolo-test"
	err = s.Check(context.Background(), []string{"a"})
	if err == nil || !strings.Contains(err.Error(), "host a: cannot change to directory /nonexistent/kolo-test") {
		t.Errorf("missing working directory: got %v", err)
	}
}

// An sshd that is still starting refuses for a moment: the check tries again, within its deadline.
func TestSSHCheckWaitsForARefusingHost(t *testing.T) {
	prog, _ := fakeSSH(t)
	s := &SSHStarter{Program: prog}
	if err := s.Check(context.Background(), []string{"a", "starting-3"}); err != nil {
		t.Fatalf("a host that refused three times, then answered: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	err := s.Check(ctx, []string{"refusing-1"})
	if err == nil || !strings.Contains(err.Error(), "host refusing-1: ssh (ssh's default port) failed: ssh: connect to host refusing-1 port 22: Connection refused") {
		t.Errorf("a host that always refuses: got %v", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the check of a refusing host took %s, past its 2 s deadline", took)
	}
}

func TestWorkerScriptRefusesMarkerLine(t *testing.T) {
	if _, err := workerScript("/", []string{"X=a\n" + payloadEnd + "\nb"}, []string{"true"}); err == nil {
		t.Error("a value holding the payload marker line was accepted")
	}
}
