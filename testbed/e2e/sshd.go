package e2e

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// SSHHosts are network-namespace hosts that each run Debian's sshd on their own address, with a
// host name of their own (a UTS namespace), reachable from this process's namespace over the bridge.
type SSHHosts struct {
	*Netns
	Port      int
	Key       string   // client private key that every host accepts
	OtherKey  string   // a key no host accepts
	Hostnames []string // what `hostname` says on each host
	Dir       string
	sshd      []*exec.Cmd
}

// NewSSHHosts makes n namespace hosts with sshd listening on port, or skips (fails under
// KOLO_REQUIRE_TESTBEDS=1) where that cannot be done. Everything is removed by t.Cleanup, sshd
// first.
func NewSSHHosts(t testing.TB, n, port int) *SSHHosts {
	t.Helper()
	for _, bin := range []string{"/usr/sbin/sshd", "ssh", "ssh-keygen", "unshare"} {
		if _, err := exec.LookPath(bin); err != nil {
			Unavailable(t, "%s not found (apt-get install openssh-server openssh-client util-linux)", bin)
		}
	}
	ns := NewNetns(t, n)
	dir := t.TempDir()
	h := &SSHHosts{Netns: ns, Port: port, Dir: dir,
		Key: filepath.Join(dir, "id_client"), OtherKey: filepath.Join(dir, "id_other")}
	hostKey := filepath.Join(dir, "host_key")
	for _, k := range []string{h.Key, h.OtherKey, hostKey} {
		if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", k).CombinedOutput(); err != nil {
			t.Fatalf("ssh-keygen %s: %v: %s", k, err, out)
		}
	}
	pub, err := os.ReadFile(h.Key + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	auth := filepath.Join(dir, "authorized_keys")
	if err := os.WriteFile(auth, pub, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll("/run/sshd", 0o755); err != nil { // sshd's privilege separation directory
		Unavailable(t, "cannot create /run/sshd: %v", err)
	}
	// Root's .bashrc may be slow (pyenv): each host's mount namespace sees an empty one.
	empty := filepath.Join(dir, "empty")
	os.WriteFile(empty, nil, 0o644)
	home, _ := os.UserHomeDir()
	bashrc := filepath.Join(home, ".bashrc")
	t.Cleanup(h.stop)
	for i, name := range ns.Names {
		conf := filepath.Join(dir, fmt.Sprintf("sshd_config.%d", i))
		text := strings.Join([]string{
			"ListenAddress " + ns.Addrs[i],
			"PidFile " + filepath.Join(dir, fmt.Sprintf("sshd.%d.pid", i)),
			"AuthorizedKeysFile " + auth,
			"PermitRootLogin prohibit-password",
			"PasswordAuthentication no",
			"KbdInteractiveAuthentication no",
			"UsePAM no",
			"StrictModes no",
			"",
		}, "\n")
		if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		hostname := fmt.Sprintf("%s-h%d", name, i+1)
		h.Hostnames = append(h.Hostnames, hostname)
		script := "hostname " + hostname
		if _, err := os.Stat(bashrc); err == nil {
			script += fmt.Sprintf("; mount --bind %s %s", empty, bashrc)
		}
		script += fmt.Sprintf("; exec /usr/sbin/sshd -D -p %d -f %s -h %s -E %s",
			port, conf, hostKey, filepath.Join(dir, fmt.Sprintf("sshd.%d.log", i)))
		cmd := exec.Command("ip", "netns", "exec", name, "unshare", "--uts", "--mount", "sh", "-c", script)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			Unavailable(t, "start sshd in %s: %v", name, err)
		}
		h.sshd = append(h.sshd, cmd)
	}
	for i, addr := range ns.Addrs {
		if err := waitListening(net.JoinHostPort(addr, strconv.Itoa(port)), 5*time.Second); err != nil {
			log, _ := os.ReadFile(filepath.Join(dir, fmt.Sprintf("sshd.%d.log", i)))
			t.Fatalf("sshd on %s: %v\nlog: %s", addr, err, log)
		}
	}
	return h
}

func waitListening(addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not listening after %s: %w", timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (h *SSHHosts) stop() {
	for _, c := range h.sshd {
		syscall.Kill(-c.Process.Pid, syscall.SIGTERM)
		c.Wait()
	}
}

// SSHFlags are the kolo run flags that reach these hosts with Key.
func (h *SSHHosts) SSHFlags() []string {
	return []string{"-p", strconv.Itoa(h.Port), "-i", h.Key,
		"--ssh-option", "StrictHostKeyChecking=no", "--ssh-option", "UserKnownHostsFile=/dev/null",
		"--ssh-option", "LogLevel=ERROR", "--ssh-option", "IdentitiesOnly=yes"}
}

// SSHDPids are the pids of the sshd servers, which live in the namespaces between jobs.
func (h *SSHHosts) SSHDPids() map[int]bool {
	m := map[int]bool{}
	for _, c := range h.sshd {
		m[c.Process.Pid] = true
	}
	return m
}

// NamespaceProcs lists "pid cmdline" of the processes in namespace i, except the pids in skip.
func (ns *Netns) NamespaceProcs(i int, skip map[int]bool) []string {
	out, err := exec.Command("ip", "netns", "pids", ns.Names[i]).Output()
	if err != nil {
		return []string{"cannot list: " + err.Error()}
	}
	var left []string
	for _, f := range strings.Fields(string(out)) {
		pid, err := strconv.Atoi(f)
		if err != nil || skip[pid] {
			continue
		}
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue // gone meanwhile
		}
		left = append(left, fmt.Sprintf("%d %s", pid, strings.TrimSpace(strings.ReplaceAll(string(cmdline), "\x00", " "))))
	}
	return left
}
