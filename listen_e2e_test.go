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
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/e2e"
)

// A job on one host listens on loopback only: the launcher's rendezvous and every rank's peer
// listener, read from /proc as a stranger's port scan would find them.
func TestOneHostJobListensOnLoopback(t *testing.T) {
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
	for i, pid := range pids {
		addrs, err := listeningAddrs(pid)
		if err != nil {
			t.Fatal(err)
		}
		if len(addrs) == 0 {
			t.Errorf("process %d (%d of launcher and ranks) listens nowhere: the test reads the wrong sockets", pid, i)
		}
		for _, a := range addrs {
			if !a.IP.IsLoopback() {
				t.Errorf("process %d (%d of launcher and ranks) listens on %s, want loopback only (all: %v)", pid, i, a, addrs)
			}
		}
	}
	l.cmd.Process.Signal(os.Interrupt)
	if code := l.wait(t, 20*time.Second); code != 130 {
		t.Errorf("exit %d after Ctrl-C, want 130\n%s", code, l.output())
	}
}

// listeningAddrs are the TCP addresses process pid listens on: its sockets (/proc/PID/fd) matched by
// inode to the listening rows of its network namespace's tables (/proc/PID/net/tcp and tcp6).
func listeningAddrs(pid int) ([]*net.TCPAddr, error) {
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
