package kolo_test

import (
	"bytes"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/e2e"
)

// stampedOutput keeps a process's output with the time each line arrived, so that a test can
// time what the ranks print against what it did.
type stampedOutput struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	part  []byte
	lines []stampedLine
}

type stampedLine struct {
	at   time.Time
	text string
}

func (s *stampedOutput) Write(p []byte) (int, error) {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.buf.Write(p)
	s.part = append(s.part, p...)
	for {
		i := bytes.IndexByte(s.part, '\n')
		if i < 0 {
			break
		}
		s.lines = append(s.lines, stampedLine{now, string(s.part[:i])})
		s.part = s.part[i+1:]
	}
	return len(p), nil
}

func (s *stampedOutput) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

// first returns the first line matching re that arrived after t.
func (s *stampedOutput) first(re *regexp.Regexp, after time.Time) (stampedLine, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range s.lines {
		if l.at.After(after) && re.MatchString(l.text) {
			return l, true
		}
	}
	return stampedLine{}, false
}

// elasticHostJob is one elastic kolo run over ssh to network-namespace hosts, with the Go
// example as its workers.
type elasticHostJob struct {
	cmd    *exec.Cmd
	out    stampedOutput
	stderr lockedBuffer
	done   chan struct{}
	code   int
}

func startElasticHostJob(t testing.TB, kolo, softmax string, hosts *e2e.SSHHosts, slots int, flags []string, args ...string) *elasticHostJob {
	t.Helper()
	var spec []string
	for _, a := range hosts.Addrs {
		spec = append(spec, fmt.Sprintf("%s:%d", a, slots))
	}
	np := slots * len(hosts.Addrs)
	argv := append([]string{"run"}, hosts.SSHFlags()...)
	argv = append(argv, "-np", strconv.Itoa(np), "--min-np", "1", "-H", strings.Join(spec, ","),
		"--network-interface", hosts.Bridge+",eth0")
	argv = append(append(argv, flags...), softmax, "-elastic")
	argv = append(argv, args...)
	j := &elasticHostJob{cmd: exec.Command(kolo, argv...), done: make(chan struct{})}
	j.cmd.Env = launchEnv()
	j.cmd.Stdout, j.cmd.Stderr = &j.out, &j.stderr
	j.cmd.WaitDelay = 5 * time.Second
	if err := j.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		j.cmd.Wait()
		j.code = j.cmd.ProcessState.ExitCode()
		close(j.done)
	}()
	t.Cleanup(func() {
		select {
		case <-j.done:
		default:
			j.cmd.Process.Kill()
			<-j.done
		}
	})
	return j
}

func (j *elasticHostJob) output() string {
	return "stdout:\n" + j.out.String() + "\nstderr:\n" + j.stderr.String()
}

// await waits for a line matching re that arrives after since.
func (j *elasticHostJob) await(t testing.TB, re *regexp.Regexp, since time.Time, timeout time.Duration) stampedLine {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if l, ok := j.out.first(re, since); ok {
			return l
		}
		select {
		case <-j.done:
			if l, ok := j.out.first(re, since); ok {
				return l
			}
			t.Fatalf("kolo run ended (exit %d) before a line matched %s\n%s", j.code, re, j.output())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no line matched %s within %s\n%s", re, timeout, j.output())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// killHost kills every process of namespace host i but its sshd: the workers, their wrapper
// shells and the ssh sessions, as a host that dies takes them all at once.
func killHost(t testing.TB, hosts *e2e.SSHHosts, i int) {
	t.Helper()
	out, err := exec.Command("ip", "netns", "pids", hosts.Names[i]).Output()
	if err != nil {
		t.Fatalf("list host %d's processes: %v", i, err)
	}
	sshd := hosts.SSHDPids()
	for _, f := range strings.Fields(string(out)) {
		if pid, err := strconv.Atoi(f); err == nil && !sshd[pid] {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// The scenario on emulated hosts: 4 network-namespace hosts x 2 ranks, reached over
// ssh, training the Go example; the host of rank 0 dies (every process on it SIGKILLed). The
// survivors keep their processes and go on as a world of 6 from their last commit, their first
// step there within 5 s of the kill, and end with identical weights.
func TestElasticHostKilled(t *testing.T) {
	hosts := e2e.NewSSHHosts(t, 4, 12346)
	kolo, softmax := buildKolo(t), buildSoftmax(t)
	j := startElasticHostJob(t, kolo, softmax, hosts, 2, nil, "-steps", "1500", "-commit", "10", "-pace", "5ms")
	start := time.Now()
	j.await(t, regexp.MustCompile(`<stdout>:step +200 `), start, 90*time.Second)
	before := workerPids(j.out.String())
	if len(before) != 8 {
		t.Fatalf("%d workers reported their pid, want 8\n%s", len(before), j.output())
	}
	victim := hosts.Addrs[0] // rank 0's host: the coordinator and the state's first holder
	killed := time.Now()
	killHost(t, hosts, 0)
	l := j.await(t, regexp.MustCompile(`<stdout>:round \d+: 6 ranks from step \d+$`), killed, 60*time.Second)
	resumed := l.at.Sub(killed)
	select {
	case <-j.done:
	case <-time.After(2 * time.Minute):
		t.Fatalf("kolo run still running 2 minutes after the kill\n%s", j.output())
	}
	if j.code != 0 {
		t.Fatalf("kolo run exited %d\n%s", j.code, j.output())
	}
	after := workerPids(j.out.String())
	for place, pids := range before {
		if strings.HasPrefix(place, victim+"[") {
			continue
		}
		if got := after[place]; len(got) != 1 || got[0] != pids[0] {
			t.Errorf("survivor %s: pids %v, want only %d: it was restarted", place, got, pids[0])
		}
	}
	for _, s := range []int{0, 1} {
		if p := after[fmt.Sprintf("%s[%d]", victim, s)]; len(p) != 1 {
			t.Errorf("the dead host's slot %d ran %d workers, want 1 (it is blacklisted)", s, len(p))
		}
	}
	m := roundLine.FindStringSubmatch(l.text)
	from, _ := strconv.Atoi(m[3])
	if from < 200-10 {
		t.Errorf("the new world resumed from step %d: the commit at step 200 or later was lost", from)
	}
	if !strings.Contains(j.out.String(), "trained on 6 ranks: every rank holds identical weights") {
		t.Errorf("no identical-weights line\n%s", j.output())
	}
	if resumed > 5*time.Second {
		t.Errorf("the new world's first step came %.2f s after the kill, want within 5 s\n%s", resumed.Seconds(), j.output())
	}
	t.Logf("host %s killed; 6 survivors took their first step in round %s %.2f s later, from step %d", victim, m[1], resumed.Seconds(), from)
	checkNoOrphans(t, hosts.Netns, hosts.SSHDPids())
}

// A host that died comes back (its blacklisting ends: --blacklist-cooldown-range): the launcher
// starts its workers again, the survivors move to the round with them at their next commit
// without a restart, and the job trains on 8 ranks again.
func TestElasticHostComesBack(t *testing.T) {
	hosts := e2e.NewSSHHosts(t, 4, 12347)
	kolo, softmax := buildKolo(t), buildSoftmax(t)
	j := startElasticHostJob(t, kolo, softmax, hosts, 2, []string{"--blacklist-cooldown-range", "2", "3"},
		"-steps", "2500", "-commit", "10", "-pace", "5ms")
	start := time.Now()
	j.await(t, regexp.MustCompile(`<stdout>:step +100 `), start, 90*time.Second)
	before := workerPids(j.out.String())
	killed := time.Now()
	killHost(t, hosts, 2)
	shrunk := j.await(t, regexp.MustCompile(`<stdout>:round \d+: 6 ranks from step`), killed, 60*time.Second)
	back := j.await(t, regexp.MustCompile(`<stdout>:round \d+: 8 ranks from step`), shrunk.at, 60*time.Second)
	select {
	case <-j.done:
	case <-time.After(2 * time.Minute):
		t.Fatalf("kolo run still running\n%s", j.output())
	}
	if j.code != 0 {
		t.Fatalf("kolo run exited %d\n%s", j.code, j.output())
	}
	after := workerPids(j.out.String())
	dead := hosts.Addrs[2] + "["
	for place, pids := range before {
		got := after[place]
		if strings.HasPrefix(place, dead) {
			if len(got) != 2 {
				t.Errorf("%s ran %d workers, want 2 (the one killed, then one after the cooldown)", place, len(got))
			}
		} else if len(got) != 1 || got[0] != pids[0] {
			t.Errorf("survivor %s: pids %v, want only %d", place, got, pids[0])
		}
	}
	if !strings.Contains(j.out.String(), "trained on 8 ranks: every rank holds identical weights") {
		t.Errorf("no identical-weights line on 8 ranks\n%s", j.output())
	}
	// The cooldown is at most 3 s after the kill; the host's workers start, meet the survivors
	// at their next commit and train: 10 s covers that with room.
	if d := back.at.Sub(killed); d > 3*time.Second+10*time.Second {
		t.Errorf("the host was back in the job %.1f s after the kill, want within 13 s (3 s of cooldown + 10)", d.Seconds())
	}
	t.Logf("killed at 0; 6 ranks trained at %.2f s; 8 ranks again at %.2f s", shrunk.at.Sub(killed).Seconds(), back.at.Sub(killed).Seconds())
}
