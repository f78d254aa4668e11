package e2e

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kolo-dl/kolo/internal/settings"
)

// CapEgress puts a token-bucket filter on every host's eth0, so that what a host sends leaves it
// at no more than rate (tc's syntax: 1gbit, 500mbit), queueing at most latency's worth of it (tc's
// syntax: 400ms). Only egress is shaped: traffic between two hosts crosses the sender's cap, once.
// The qdiscs go with the namespaces.
func (ns *Netns) CapEgress(rate, latency string) error {
	for _, name := range ns.Names {
		// A 256 kbit burst keeps a 1 Gbit/s cap at ~95% of its rate; a 32 kbit one halves it.
		out, err := exec.Command("ip", "netns", "exec", name, "tc", "qdisc", "add", "dev", "eth0", "root",
			"tbf", "rate", rate, "burst", "256kbit", "latency", latency).CombinedOutput()
		if err != nil {
			return fmt.Errorf("tc qdisc add (tbf rate %s) in %s: %v: %s", rate, name, err, strings.TrimSpace(string(out)))
		}
	}
	return nil
}

// StreamEnv is set in a re-executed test binary to make it one end of TCPStream's stream:
// "recv ADDR SECONDS" or "send ADDR:PORT". Main runs it and exits.
var StreamEnv = settings.E2ETCPStream.Name

// TCPStream sends one TCP stream from host from to host to for d and returns what arrived after
// the first quarter of d (slow start and the bucket's burst left out), in bits per second. Each end
// is this test binary re-executed in its host's namespace (the test package's TestMain must call
// Main); both are stopped by pid before it returns.
func (ns *Netns) TCPStream(from, to int, d time.Duration) (float64, error) {
	self, err := os.Executable()
	if err != nil {
		return 0, err
	}
	start := func(host int, role string) (*exec.Cmd, *bufio.Scanner, error) {
		cmd := exec.Command("ip", "netns", "exec", ns.Names[host], self)
		cmd.Env = append(os.Environ(), StreamEnv+"="+role)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			return nil, nil, err
		}
		if err := cmd.Start(); err != nil {
			return nil, nil, fmt.Errorf("start the stream's %s end on host %d: %w", strings.Fields(role)[0], host, err)
		}
		return cmd, bufio.NewScanner(out), nil
	}
	stop := func(cmd *exec.Cmd) {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
	}
	recv, recvOut, err := start(to, fmt.Sprintf("recv %s %g", ns.Addrs[to], d.Seconds()))
	if err != nil {
		return 0, err
	}
	defer stop(recv)
	if !recvOut.Scan() {
		return 0, fmt.Errorf("stream receiver on host %d said nothing", to)
	}
	addr := strings.TrimPrefix(recvOut.Text(), "listening ")
	send, _, err := start(from, "send "+addr)
	if err != nil {
		return 0, err
	}
	defer stop(send)
	if !recvOut.Scan() {
		return 0, fmt.Errorf("stream receiver on host %d ended without a result", to)
	}
	bps, err := strconv.ParseFloat(strings.TrimPrefix(recvOut.Text(), "bits/s "), 64)
	if err != nil {
		return 0, fmt.Errorf("stream receiver on host %d: %q", to, recvOut.Text())
	}
	return bps, nil
}

// runStream is one end of TCPStream's stream, in its own process.
func runStream(role string) error {
	f := strings.Fields(role)
	switch {
	case len(f) == 3 && f[0] == "recv":
		secs, err := strconv.ParseFloat(f[2], 64)
		if err != nil {
			return err
		}
		d := time.Duration(secs * float64(time.Second))
		ln, err := net.Listen("tcp", net.JoinHostPort(f[1], "0"))
		if err != nil {
			return err
		}
		fmt.Printf("listening %s\n", ln.Addr())
		ln.(*net.TCPListener).SetDeadline(time.Now().Add(10 * time.Second)) // the sender may never come
		c, err := ln.Accept()
		if err != nil {
			return fmt.Errorf("accept: %w", err)
		}
		start := time.Now()
		skip, end := start.Add(d/4), start.Add(d)
		c.SetReadDeadline(end.Add(5 * time.Second))
		buf := make([]byte, 1<<20)
		var counted int64
		var first time.Time
		for time.Now().Before(end) {
			n, err := c.Read(buf)
			if err != nil {
				return fmt.Errorf("receive: %w", err)
			}
			if now := time.Now(); now.After(skip) {
				if first.IsZero() {
					first = now // the bytes of this read arrived before it: not counted
					continue
				}
				counted += int64(n)
			}
		}
		took := time.Since(first).Seconds()
		if counted == 0 || took <= 0 {
			return fmt.Errorf("no data in %s", d)
		}
		fmt.Printf("bits/s %g\n", 8*float64(counted)/took)
		return nil
	case len(f) == 2 && f[0] == "send":
		c, err := net.DialTimeout("tcp", f[1], 5*time.Second)
		if err != nil {
			return err
		}
		buf := make([]byte, 1<<20)
		for {
			if _, err := c.Write(buf); err != nil {
				return nil // the receiver is done
			}
		}
	}
	return fmt.Errorf("%s=%q: want \"recv ADDR SECONDS\" or \"send ADDR:PORT\"", StreamEnv, role)
}
