package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Slurm is a one-node Slurm cluster of this machine, private to one test: its own munged (own key
// and socket), slurmctld and slurmd on free loopback ports, state and logs in Dir. Commands run
// against it with Env (SLURM_CONF points at its slurm.conf).
type Slurm struct {
	Dir   string   // configuration, state, logs; removed at cleanup unless the test failed
	Conf  string   // slurm.conf
	Node  string   // the first node's name (this machine's host name for a one-node cluster)
	Nodes []string // every node's name
	CPUs  int      // CPUs each node claims (may exceed the real cores: tasks oversubscribe)

	ns      *Netns // nodes in network namespaces (StartSlurmNodes); nil: this machine
	daemons []*exec.Cmd
}

// StartSlurm brings up the cluster (about a second), or calls Unavailable where that cannot be
// done here (not root, Debian's slurm-wlm/munge not installed). Everything it starts is stopped by
// PID in t.Cleanup, after cancelling jobs still running.
func StartSlurm(t testing.TB, cpus int) *Slurm {
	t.Helper()
	return startSlurm(t, cpus, nil)
}

// StartSlurmNodes is StartSlurm with one node per host of ns: each node's slurmd runs in its
// namespace, under a host name of its own (a UTS namespace), and slurmctld here, reached at the
// bridge's address. Jobs span the nodes; a node's processes can be killed as a host's are.
func StartSlurmNodes(t testing.TB, ns *Netns, cpus int) *Slurm {
	t.Helper()
	return startSlurm(t, cpus, ns)
}

func startSlurm(t testing.TB, cpus int, ns *Netns) *Slurm {
	t.Helper()
	if os.Geteuid() != 0 {
		Unavailable(t, "a private Slurm cluster needs root (slurmd runs jobs as their users)")
	}
	for _, bin := range []string{"munged", "munge", "slurmctld", "slurmd", "srun", "salloc", "sbatch", "sinfo", "scontrol", "scancel", "squeue"} {
		if _, err := lookPath(bin); err != nil {
			Unavailable(t, "no %s (apt-get install slurm-wlm munge)", bin)
		}
	}
	if ns != nil {
		for _, bin := range []string{"nsenter", "unshare"} {
			if _, err := lookPath(bin); err != nil {
				Unavailable(t, "no %s (apt-get install util-linux)", bin)
			}
		}
	}
	mu, err := user.Lookup("munge")
	if err != nil {
		Unavailable(t, "no munge user (apt-get install munge): %v", err)
	}
	node, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	// Not t.TempDir: munged runs as user munge and must traverse the path to its socket.
	dir, err := os.MkdirTemp("", "kolo-slurm-")
	if err != nil {
		t.Fatal(err)
	}
	s := &Slurm{Dir: dir, Conf: filepath.Join(dir, "slurm.conf"), Node: node, Nodes: []string{node}, CPUs: cpus, ns: ns}
	if ns != nil {
		s.Nodes = nil
		for i := range ns.Names {
			s.Nodes = append(s.Nodes, fmt.Sprintf("%sn%d", ns.Bridge, i+1))
		}
		s.Node = s.Nodes[0]
	}
	t.Cleanup(func() {
		s.stop(t)
		if !t.Failed() {
			os.RemoveAll(dir)
		} else {
			t.Logf("Slurm cluster files kept in %s", dir)
		}
	})
	if err := s.start(mu); err != nil {
		t.Fatalf("start Slurm: %v\n%s", err, s.logs())
	}
	return s
}

func lookPath(bin string) (string, error) {
	if p, err := exec.LookPath(bin); err == nil {
		return p, nil
	}
	for _, d := range []string{"/usr/sbin", "/sbin"} {
		if p := filepath.Join(d, bin); fileExists(p) {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found", bin)
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

func (s *Slurm) path(name string) string { return filepath.Join(s.Dir, name) }

func (s *Slurm) start(mu *user.User) error {
	uid, _ := strconv.Atoi(mu.Uid)
	gid, _ := strconv.Atoi(mu.Gid)
	mdir := s.path("munge")
	if err := os.Chmod(s.Dir, 0o755); err != nil {
		return err
	}
	if err := os.Mkdir(mdir, 0o755); err != nil {
		return err
	}
	key := make([]byte, 1024)
	rand.Read(key)
	keyFile := filepath.Join(mdir, "munge.key")
	if err := os.WriteFile(keyFile, key, 0o600); err != nil {
		return err
	}
	for _, p := range []string{mdir, keyFile} {
		if err := os.Chown(p, uid, gid); err != nil {
			return err
		}
	}
	socket := filepath.Join(mdir, "socket")
	munged, _ := lookPath("munged")
	m := exec.Command(munged, "-F", "--socket="+socket, "--key-file="+keyFile,
		"--pid-file="+filepath.Join(mdir, "pid"), "--log-file="+filepath.Join(mdir, "log"), "--seed-file="+filepath.Join(mdir, "seed"))
	m.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	if err := s.daemon(m, "munged.out"); err != nil {
		return err
	}
	if err := poll(10*time.Second, "munged to answer", func() error {
		enc := exec.Command("munge", "-S", socket, "-n")
		cred, err := enc.Output()
		if err != nil {
			return err
		}
		dec := exec.Command("unmunge", "-S", socket)
		dec.Stdin = bytes.NewReader(cred)
		return dec.Run()
	}); err != nil {
		return err
	}

	ports, err := freePorts(2)
	if err != nil {
		return err
	}
	if err := os.Mkdir(s.path("state"), 0o755); err != nil {
		return err
	}
	ctldName, ctldAddr := s.Node, "127.0.0.1"
	nodes := fmt.Sprintf("NodeName=%s NodeAddr=127.0.0.1 CPUs=%d State=UNKNOWN\n", s.Node, s.CPUs)
	if s.ns != nil {
		// slurmctld insists on running on the host SlurmctldHost names: this machine.
		host, err := os.Hostname()
		if err != nil {
			return err
		}
		ctldName, ctldAddr, nodes = host, s.ns.Gateway, ""
		for i, n := range s.Nodes {
			nodes += fmt.Sprintf("NodeName=%s NodeAddr=%s CPUs=%d State=UNKNOWN\n", n, s.ns.Addrs[i], s.CPUs)
		}
	}
	for _, n := range s.Nodes {
		if err := os.Mkdir(s.path("spool-"+n), 0o755); err != nil {
			return err
		}
	}
	conf := fmt.Sprintf(`# private cluster of a kolo test
ClusterName=kolotest
SlurmctldHost=%[1]s(%[7]s)
SlurmctldPort=%[2]d
SlurmdPort=%[3]d
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=%[4]s
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
StateSaveLocation=%[5]s/state
SlurmdSpoolDir=%[5]s/spool-%%n
SlurmctldPidFile=%[5]s/slurmctld.pid
SlurmdPidFile=%[5]s/slurmd-%%n.pid
SlurmctldLogFile=%[5]s/slurmctld.log
SlurmdLogFile=%[5]s/slurmd-%%n.log
SlurmdParameters=config_overrides
%[6]sPartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
`, ctldName, ports[0], ports[1], socket, s.Dir, nodes, ctldAddr)
	if err := os.WriteFile(s.Conf, []byte(conf), 0o644); err != nil {
		return err
	}
	ctld, _ := lookPath("slurmctld")
	slurmd, _ := lookPath("slurmd")
	if err := s.daemon(s.cmd(ctld, "-D", "-i"), "slurmctld.out"); err != nil {
		return err
	}
	if s.ns == nil {
		if err := s.daemon(s.cmd(slurmd, "-D", "-N", s.Node), "slurmd.out"); err != nil {
			return err
		}
	} else {
		for i, n := range s.Nodes {
			// nsenter, not ip netns exec: that mounts a /sys of the namespace, without the
			// cgroup hierarchy slurmd insists on finding.
			c := s.cmd("nsenter", "--net=/run/netns/"+s.ns.Names[i], "unshare", "--uts", "sh", "-c",
				fmt.Sprintf("hostname %s && exec %s -D -N %s", n, slurmd, n))
			if err := s.daemon(c, "slurmd-"+n+".out"); err != nil {
				return err
			}
		}
	}
	return poll(30*time.Second, "every node to become idle (sinfo)", func() error {
		out, err := s.cmd("sinfo", "-h", "-N", "-o", "%t").Output()
		if err != nil {
			return err
		}
		if st := strings.Fields(string(out)); len(st) != len(s.Nodes) || strings.Trim(strings.Join(st, " "), "idle ") != "" {
			return fmt.Errorf("node states %q", st)
		}
		return nil
	})
}

// Env is this process's environment with SLURM_CONF pointing at the cluster.
func (s *Slurm) Env() []string { return append(os.Environ(), "SLURM_CONF="+s.Conf) }

func (s *Slurm) cmd(name string, args ...string) *exec.Cmd {
	c := exec.Command(name, args...)
	c.Env = s.Env()
	return c
}

// Command runs a Slurm client command (srun, sbatch, ...) against the cluster, with extra
// environment variables for the job.
func (s *Slurm) Command(ctx context.Context, extraEnv []string, name string, args ...string) *exec.Cmd {
	c := exec.CommandContext(ctx, name, args...)
	c.Env = append(s.Env(), extraEnv...)
	c.WaitDelay = 5 * time.Second
	return c
}

// Sbatch submits script (its text; written to the cluster's directory) with sbatch's args and
// extra environment (exported to the job), waits for the job to end and returns its final state
// (COMPLETED, FAILED, ...) and the path of its output file.
func (s *Slurm) Sbatch(t testing.TB, timeout time.Duration, script string, extraEnv []string, args ...string) (state, output string) {
	t.Helper()
	f, err := os.CreateTemp(s.Dir, "job-*.sh")
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(script)
	f.Close()
	os.Chmod(f.Name(), 0o755)
	output = strings.TrimSuffix(f.Name(), ".sh") + ".out"
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	argv := append([]string{"--parsable", "-o", output}, args...)
	out, err := s.Command(ctx, extraEnv, "sbatch", append(argv, f.Name())...).CombinedOutput()
	if err != nil {
		t.Fatalf("sbatch: %v: %s", err, out)
	}
	id := strings.TrimSpace(strings.Split(strings.TrimSpace(string(out)), ";")[0])
	stateRE := regexp.MustCompile(`JobState=(\S+)`)
	err = poll(timeout, "sbatch job "+id+" to end", func() error {
		out, err := s.cmd("scontrol", "show", "job", id).Output()
		if err != nil {
			return err
		}
		m := stateRE.FindSubmatch(out)
		if m == nil {
			return fmt.Errorf("no JobState in %q", out)
		}
		switch state = string(m[1]); state {
		case "PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED":
			return fmt.Errorf("job %s is %s", id, state)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, s.logs())
	}
	return state, output
}

// stop cancels what still runs and stops the daemons by PID, newest first.
func (s *Slurm) stop(t testing.TB) {
	if len(s.daemons) < 3 { // slurmctld never started: nothing to cancel
	} else if out, err := s.cmd("squeue", "-h", "-o", "%i").Output(); err == nil {
		for _, id := range strings.Fields(string(out)) {
			s.cmd("scancel", id).Run()
		}
	}
	for i := len(s.daemons) - 1; i >= 0; i-- {
		c := s.daemons[i]
		c.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- c.Wait() }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Logf("%s did not stop after SIGTERM; killing pid %d", c.Path, c.Process.Pid)
			c.Process.Kill()
			<-done
		}
	}
	s.daemons = nil
}

// daemon starts c with its input from /dev/null and its output in the cluster directory (a pipe
// would keep the test's output open and hang it).
func (s *Slurm) daemon(c *exec.Cmd, logName string) error {
	out, err := os.Create(s.path(logName))
	if err != nil {
		return err
	}
	defer out.Close()
	c.Stdout, c.Stderr = out, out
	if err := c.Start(); err != nil {
		return fmt.Errorf("start %s: %w", c.Path, err)
	}
	s.daemons = append(s.daemons, c)
	return nil
}

// logs is the tail of every daemon log, for failure messages.
func (s *Slurm) logs() string {
	var b strings.Builder
	names := []string{"munged.out", "munge/log", "slurmctld.out", "slurmctld.log", "slurmd.out"}
	for _, n := range s.Nodes {
		names = append(names, "slurmd-"+n+".out", "slurmd-"+n+".log")
	}
	for _, name := range names {
		data, err := os.ReadFile(s.path(name))
		if err != nil || len(data) == 0 {
			continue
		}
		if len(data) > 2000 {
			data = data[len(data)-2000:]
		}
		fmt.Fprintf(&b, "--- %s:\n%s\n", name, data)
	}
	return b.String()
}

// poll calls f until it succeeds or timeout passes; the error says what was awaited.
func poll(timeout time.Duration, what string, f func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("waited %s for %s: %w", timeout, what, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// freePorts returns n distinct loopback ports that were free a moment ago.
func freePorts(n int) ([]int, error) {
	var ports []int
	var lns []net.Listener
	defer func() {
		for _, l := range lns {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		lns = append(lns, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
