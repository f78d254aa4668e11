package kolo_test

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/testbed/e2e"
	"github.com/kolo-dl/kolo/testbed/proctest"
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
	stderr proctest.Buffer
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
	return startKoloRun(t, kolo, append(argv, args...)...)
}

// startKoloRun starts kolo with argv, stamping its output lines; t's cleanup kills it.
func startKoloRun(t testing.TB, kolo string, argv ...string) *elasticHostJob {
	t.Helper()
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

// awaitSuccess waits, up to 2 minutes, for kolo run to end, and fails t unless it exited 0.
func (j *elasticHostJob) awaitSuccess(t testing.TB) {
	t.Helper()
	select {
	case <-j.done:
	case <-time.After(2 * time.Minute):
		t.Fatalf("kolo run still running after 2 minutes\n%s", j.output())
	}
	if j.code != 0 {
		t.Fatalf("kolo run exited %d\n%s", j.code, j.output())
	}
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

// checkSurvivorsKept checks that every worker seen before the loss of host lost, except that
// host's, is the same process at the end: never restarted.
func checkSurvivorsKept(t testing.TB, before, after map[string][]int, lost string) {
	t.Helper()
	for place, pids := range before {
		if strings.HasPrefix(place, lost+"[") {
			continue
		}
		if got := after[place]; len(got) != 1 || got[0] != pids[0] {
			t.Errorf("survivor %s: pids %v, want only %d: it was restarted", place, got, pids[0])
		}
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
	j.awaitSuccess(t)
	after := workerPids(j.out.String())
	checkSurvivorsKept(t, before, after, victim)
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
	j.awaitSuccess(t)
	after := workerPids(j.out.String())
	dead := hosts.Addrs[2] + "["
	checkSurvivorsKept(t, before, after, hosts.Addrs[2])
	for place := range before {
		if got := after[place]; strings.HasPrefix(place, dead) && len(got) != 2 {
			t.Errorf("%s ran %d workers, want 2 (the one killed, then one after the cooldown)", place, len(got))
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

// workerPidsOn lists the pids of the Go example's workers running on namespace host i.
func workerPidsOn(hosts *e2e.SSHHosts, i int) []int {
	out, err := exec.Command("ip", "netns", "pids", hosts.Names[i]).Output()
	if err != nil {
		return nil
	}
	var pids []int
	for _, f := range strings.Fields(string(out)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			continue
		}
		if cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil && bytes.Contains(cmd, []byte("-elastic")) && !bytes.HasPrefix(cmd, []byte("sh\x00")) && !bytes.HasPrefix(cmd, []byte("/bin/sh\x00")) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// Chaos: random kills of whole hosts and of single workers (rank 0's host included), some
// right after the previous kill, while the survivors re-form their world, and some while hosts
// back from their cooldown are joining and syncing. Every kill must be followed by training in a
// new world within 30 s (no hang), and Ctrl-C at the end stops everything within seconds.
// KOLO_CHAOS_KILLS sets the number of kills (default 12; docs/elastic.md reports a run of 100).
func TestElasticChaos(t *testing.T) {
	kills := 12
	if v := os.Getenv("KOLO_CHAOS_KILLS"); v != "" {
		kills, _ = strconv.Atoi(v)
	}
	hosts := e2e.NewSSHHosts(t, 4, 12348)
	kolo, softmax := buildKolo(t), buildSoftmax(t)
	list := fmt.Sprintf("%s/hosts", t.TempDir())
	var lines []string
	for _, a := range hosts.Addrs {
		lines = append(lines, a+":2")
	}
	if err := os.WriteFile(list, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	script := list + ".sh"
	if err := os.WriteFile(script, []byte("#!/bin/sh\ncat "+list+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	// A discovery script instead of startElasticHostJob's -H.
	argv := append([]string{"run"}, hosts.SSHFlags()...)
	j := startKoloRun(t, kolo, append(argv, "-np", "8", "--min-np", "1", "--host-discovery-script", script,
		"--blacklist-cooldown-range", "1", "2", "--network-interface", hosts.Bridge+",eth0",
		softmax, "-elastic", "-steps", "100000000", "-commit", "5", "-pace", "2ms")...)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	roundRe := regexp.MustCompile(`<stdout>:round \d+: (\d+) ranks from step`)
	last := j.await(t, roundRe, time.Now().Add(-time.Hour), 90*time.Second)
	var worst time.Duration
	kinds := map[string]int{}
	for k := 0; k < kills; k++ {
		// Half the kills come 0-300 ms after the last one's new world started training (its
		// neighbours may still be syncing or joining); the others 0.3-2 s after.
		if rng.IntN(2) == 0 {
			time.Sleep(time.Duration(rng.IntN(300)) * time.Millisecond)
		} else {
			time.Sleep(300*time.Millisecond + time.Duration(rng.IntN(1700))*time.Millisecond)
		}
		// Keep a host alive: with every host blacklisted the job ends (with that reason), which
		// is no hang but ends the chaos.
		up := 0
		for i := range hosts.Addrs {
			if len(workerPidsOn(hosts, i)) > 0 {
				up++
			}
		}
		h := rng.IntN(len(hosts.Addrs))
		pids := workerPidsOn(hosts, h)
		if len(pids) == 0 || up < 2 {
			kinds["waited for hosts to come back"]++
			time.Sleep(200 * time.Millisecond)
			k--
			continue
		}
		killed := time.Now()
		if rng.IntN(2) == 0 {
			killHost(t, hosts, h)
			kinds["host"]++
		} else {
			syscall.Kill(pids[rng.IntN(len(pids))], syscall.SIGKILL)
			kinds["worker"]++
		}
		l, ok := time.Time{}, false
		deadline := killed.Add(30 * time.Second)
		for !ok && time.Now().Before(deadline) {
			var line stampedLine
			if line, ok = j.out.first(roundRe, killed); ok {
				l = line.at
				break
			}
			select {
			case <-j.done:
				t.Fatalf("kill %d: kolo run ended (exit %d)\n%s", k+1, j.code, j.output())
			case <-time.After(20 * time.Millisecond):
			}
		}
		if !ok {
			t.Fatalf("kill %d (host %d): no new world trained within 30 s: a hang\n%s", k+1, h, j.output())
		}
		worst = max(worst, l.Sub(killed))
	}
	j.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-j.done:
	case <-time.After(20 * time.Second):
		t.Fatalf("kolo run still running 20 s after Ctrl-C\n%s", j.output())
	}
	if j.code != 130 {
		t.Errorf("kolo run exited %d after Ctrl-C, want 130\n%s", j.code, j.output())
	}
	checkNoOrphans(t, hosts.Netns, hosts.SSHDPids())
	t.Logf("%d kills (%v): every one followed by a training world, the slowest after %.2f s; %d rounds in all; first round at %s",
		kills, kinds, worst.Seconds(), len(roundRe.FindAllString(j.out.String(), -1)), last.at.Format("15:04:05"))
}

// A host cut off (its link down: its processes live on, nothing reaches them): the survivors'
// engines stop, on the progress deadline (3 s here) when a collective waits on the host, or
// on TCP's own time-out of the connection when negotiation does (the coordinator cannot tell a
// rank that has not submitted from one computing); they name the rank they blame when they ask
// for the next round, and the launcher stops its worker at once rather than after the grace it
// gives workers that merely have not asked yet (or stops it as unreachable, its presence record
// gone with its connection, if that comes first). The survivors train on.
func TestElasticHostCutOff(t *testing.T) {
	hosts := e2e.NewSSHHosts(t, 3, 12349)
	kolo, softmax := buildKolo(t), buildSoftmax(t)
	j := startElasticHostJob(t, kolo, softmax, hosts, 2, []string{"--progress-timeout-seconds", "3"},
		"-steps", "2000", "-commit", "10", "-pace", "5ms")
	j.await(t, regexp.MustCompile(`<stdout>:step +100 `), time.Now().Add(-time.Hour), 90*time.Second)
	before := workerPids(j.out.String())
	cut := time.Now()
	if out, err := exec.Command("ip", "-n", hosts.Names[2], "link", "set", "eth0", "down").CombinedOutput(); err != nil {
		t.Fatalf("cut host 2's link: %v: %s", err, out)
	}
	t.Cleanup(func() { killHost(t, hosts, 2) }) // its workers live on behind the cut
	l := j.await(t, regexp.MustCompile(`<stdout>:round \d+: 4 ranks from step`), cut, 60*time.Second)
	resumed := l.at.Sub(cut)
	j.awaitSuccess(t)
	after := workerPids(j.out.String())
	checkSurvivorsKept(t, before, after, hosts.Addrs[2])
	// Two mechanisms stop the cut-off workers at once, and whichever fires first wins: the
	// survivors naming the rank they found stuck, or the workers' presence records at the
	// launcher ending with their connections (TCP's time-out of the same length). With a lazy
	// mesh fewer survivors hold a connection to the cut host of their own, and the second
	// sometimes comes first. Either way no grace is waited out (the 10 s bound below).
	if e := j.stderr.String(); !strings.Contains(e, "found stuck by the other workers") && !strings.Contains(e, "can no longer be reached") {
		t.Errorf("the launcher did not stop the cut-off workers at once (named by their peers, or unreachable)\n%s", j.output())
	}
	if !strings.Contains(j.out.String(), "trained on 4 ranks: every rank holds identical weights") {
		t.Errorf("no identical-weights line\n%s", j.output())
	}
	// The control connections' user timeout follows the 3 s progress timeout, the worker named
	// stuck is stopped without waiting for it (it cannot be told), the new round forms: about
	// 3 s, bounded loosely for a loaded machine.
	if resumed > 10*time.Second {
		t.Errorf("the survivors trained again %.1f s after the cut, want within 10 s", resumed.Seconds())
	}
	t.Logf("host cut off; the 4 survivors trained again %.2f s later", resumed.Seconds())
}
