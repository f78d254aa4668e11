package kolo_test

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/testbed/e2e"
)

// A job on one host listens on Unix sockets only, all in one directory that only its user may
// enter: the launcher's rendezvous and every rank's peer listener, read from /proc as a port scan
// would find them. None listens on TCP, and the directory is gone once the job has ended.
func TestOneHostJobListensOnUnixSockets(t *testing.T) {
	kolo := buildKolo(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	l := startLauncher(t, launchEnv(), kolo, "run", "-np", "2", "-x", e2e.WorkerEnv+"=loop", self, "-test.run=^$")
	l.waitOutput(t, loopingLine, 2, time.Minute)
	pids := []int{l.cmd.Process.Pid}
	for _, m := range loopingLine.FindAllStringSubmatch(l.stdout.String(), -1) {
		pid, _ := strconv.Atoi(m[1])
		pids = append(pids, pid)
	}
	dirs := map[string]bool{}
	for i, pid := range pids {
		addrs, err := listeningAddrs(pid)
		if err != nil {
			t.Fatal(err)
		}
		if len(addrs) > 0 {
			t.Errorf("process %d (%d of launcher and ranks) listens on TCP %v, want Unix sockets only", pid, i, addrs)
		}
		socks, err := listeningUnix(pid)
		if err != nil {
			t.Fatal(err)
		}
		if len(socks) == 0 {
			t.Errorf("process %d (%d of launcher and ranks) listens on no Unix socket", pid, i)
		}
		for _, s := range socks {
			dirs[filepath.Dir(s)] = true
		}
	}
	if len(dirs) != 1 {
		t.Fatalf("the job's sockets lie in %d directories (%v), want one", len(dirs), dirs)
	}
	var dir string
	for d := range dirs {
		dir = d
	}
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); fi.Mode().Perm() != 0o700 || int(st.Uid) != os.Geteuid() {
		t.Errorf("socket directory %s: mode %v, owner %d; want 0700 and %d", dir, fi.Mode().Perm(), st.Uid, os.Geteuid())
	}
	l.cmd.Process.Signal(os.Interrupt)
	if code := l.wait(t, 20*time.Second); code != 130 {
		t.Errorf("exit %d after Ctrl-C, want 130\n%s", code, l.output())
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("socket directory %s left after the job (stat: %v)", dir, err)
	}
}

// A one-host job's socket directory lies in its TMPDIR while it runs, and is gone however the
// job ends: every rank succeeds, a rank fails, a rank is killed, the launcher is killed (its
// orphan guard removes the directory then).
func TestOneHostJobRemovesSocketDir(t *testing.T) {
	kolo := buildKolo(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// A rank that checks where the launcher told it to meet: a socket in a 0700 directory.
	check := `d=$(dirname "$KOLO_RENDEZVOUS_ADDR"); [ -S "$KOLO_RENDEZVOUS_ADDR" ] && [ "$(stat -c %a "$d")" = 700 ] && [ "$(dirname "$d")" = "$TMPDIR" ] || { echo "rendezvous $KOLO_RENDEZVOUS_ADDR is no socket in a 0700 directory in $TMPDIR" >&2; exit 9; }; `
	loop := []string{"-x", e2e.WorkerEnv + "=loop", self, "-test.run=^$"}
	for _, tc := range []struct {
		name     string
		argv     []string
		kill     string // "", "rank" or "launcher": SIGKILL once both ranks loop
		wantCode int
	}{
		{"success", []string{"/bin/sh", "-c", check + "exit 0"}, "", 0},
		{"failure", []string{"/bin/sh", "-c", check + `[ "$KOLO_RANK" = 1 ] && exit 3; sleep 30`}, "", 3},
		{"rank killed", loop, "rank", -1},
		{"launcher killed", loop, "launcher", 137},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tmp := t.TempDir()
			l := startLauncher(t, append(launchEnv(), "TMPDIR="+tmp), append([]string{kolo, "run", "-np", "2"}, tc.argv...)...)
			var ranks []int
			if tc.kill != "" {
				l.waitOutput(t, loopingLine, 2, time.Minute)
				for _, m := range loopingLine.FindAllStringSubmatch(l.stdout.String(), -1) {
					pid, _ := strconv.Atoi(m[1])
					ranks = append(ranks, pid)
				}
				if ents, _ := os.ReadDir(tmp); len(ents) != 1 || !strings.HasPrefix(ents[0].Name(), "kolo-") {
					t.Fatalf("while the job runs, its TMPDIR holds %v, want its socket directory", ents)
				}
				victim := ranks[1]
				if tc.kill == "launcher" {
					victim = l.cmd.Process.Pid
				}
				syscall.Kill(victim, syscall.SIGKILL)
			}
			code := l.wait(t, time.Minute)
			if tc.wantCode >= 0 && code != tc.wantCode || tc.wantCode < 0 && code == 0 {
				t.Errorf("exit %d, want %d\n%s", code, tc.wantCode, l.output())
			}
			// A killed launcher's guard kills the ranks, then removes the directory.
			deadline := time.Now().Add(10 * time.Second)
			for {
				ents, _ := os.ReadDir(tmp)
				if len(ents) == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("left %d entries (%s, ...) in the job's TMPDIR", len(ents), ents[0].Name())
				}
				time.Sleep(50 * time.Millisecond)
			}
		})
	}
}

// listeningUnix are the paths of the Unix sockets process pid listens on: its sockets
// (/proc/PID/fd) matched by inode to the listening rows of /proc/PID/net/unix.
func listeningUnix(pid int) ([]string, error) {
	inodes, err := socketInodes(pid)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/net/unix", pid))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var paths []string
	sc := bufio.NewScanner(f)
	sc.Scan() // the header
	for sc.Scan() {
		// Num RefCount Protocol Flags Type St Inode Path
		fields := strings.Fields(sc.Text())
		if len(fields) < 8 || fields[3] != "00010000" || !inodes[fields[6]] { // __SO_ACCEPTCON: listening
			continue
		}
		paths = append(paths, fields[7])
	}
	return paths, sc.Err()
}

// socketInodes are the inodes of the sockets process pid holds open.
func socketInodes(pid int) (map[string]bool, error) {
	fds, err := filepath.Glob(fmt.Sprintf("/proc/%d/fd/*", pid))
	if err != nil {
		return nil, err
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		if target, err := os.Readlink(fd); err == nil && strings.HasPrefix(target, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(target, "socket:["), "]")] = true
		}
	}
	return inodes, nil
}

// listeningAddrs are the TCP addresses process pid listens on: its sockets (/proc/PID/fd) matched by
// inode to the listening rows of its network namespace's tables (/proc/PID/net/tcp and tcp6).
func listeningAddrs(pid int) ([]*net.TCPAddr, error) {
	inodes, err := socketInodes(pid)
	if err != nil {
		return nil, err
	}
	var addrs []*net.TCPAddr
	for _, table := range []string{"tcp", "tcp6"} {
		f, err := os.Open(fmt.Sprintf("/proc/%d/net/%s", pid, table))
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(f)
		sc.Scan() // the header
		for sc.Scan() {
			// sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
			fields := strings.Fields(sc.Text())
			if len(fields) < 10 || fields[3] != "0A" || !inodes[fields[9]] { // 0A: TCP_LISTEN
				continue
			}
			a, err := parseProcAddr(fields[1])
			if err != nil {
				f.Close()
				return nil, fmt.Errorf("/proc/%d/net/%s: %w", pid, table, err)
			}
			addrs = append(addrs, a)
		}
		f.Close()
		if err := sc.Err(); err != nil {
			return nil, err
		}
	}
	return addrs, nil
}

// parseProcAddr reads /proc/net/tcp's "HEXIP:HEXPORT": the IP as 32-bit words in host order
// (little-endian here), the port big-endian.
func parseProcAddr(s string) (*net.TCPAddr, error) {
	ipHex, portHex, ok := strings.Cut(s, ":")
	raw, err := hex.DecodeString(ipHex)
	if !ok || err != nil || (len(raw) != 4 && len(raw) != 16) {
		return nil, fmt.Errorf("malformed address %q", s)
	}
	port, err := strconv.ParseUint(portHex, 16, 16)
	if err != nil {
		return nil, fmt.Errorf("malformed port in %q", s)
	}
	ip := make(net.IP, len(raw))
	for w := 0; w < len(raw); w += 4 {
		ip[w], ip[w+1], ip[w+2], ip[w+3] = raw[w+3], raw[w+2], raw[w+1], raw[w]
	}
	return &net.TCPAddr{IP: ip, Port: int(port)}, nil
}
