package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
)

// Netns is a set of network namespaces joined by a bridge: several "hosts" on one machine, each with
// its own address, so TCP between ranks crosses veth links for real.
type Netns struct {
	Bridge  string
	Gateway string   // the bridge's address, reachable from every namespace
	Names   []string // namespace names, one per host
	Addrs   []string
}

func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

var netnsCalls atomic.Int32

// NewNetns creates n hosts, or skips the test where namespaces cannot be made (not root, no ip;
// fails instead under KOLO_REQUIRE_TESTBEDS=1).
// Everything it creates is removed by t.Cleanup.
func NewNetns(t testing.TB, n int) *Netns {
	t.Helper()
	if os.Geteuid() != 0 {
		Unavailable(t, "network namespaces need root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		Unavailable(t, "no ip command (apt-get install iproute2)")
	}
	// Names and subnet differ per call, not only per process: the kernel removes a deleted
	// namespace's links in the background, and the next test's must not meet them.
	call := int(netnsCalls.Add(1))
	id := (os.Getpid() + 1000*call) % 10000
	subnet := 100 + (os.Getpid()+call)%150
	ns := &Netns{Bridge: fmt.Sprintf("kbr%d", id), Gateway: fmt.Sprintf("10.77.%d.254", subnet)}
	cleanup := func() {
		for _, name := range ns.Names {
			exec.Command("ip", "netns", "del", name).Run()
		}
		exec.Command("ip", "link", "del", ns.Bridge).Run()
	}
	t.Cleanup(cleanup)
	steps := [][]string{
		{"link", "add", ns.Bridge, "type", "bridge"},
		{"addr", "add", ns.Gateway + "/24", "dev", ns.Bridge},
		{"link", "set", ns.Bridge, "up"},
	}
	for _, s := range steps {
		if err := ip(s...); err != nil {
			Unavailable(t, "cannot create a bridge here: %v", err)
		}
	}
	// Docker sets the FORWARD policy to DROP, and with bridge netfilter on that drops traffic
	// between our namespaces too: accept what stays on our own bridge, and only that.
	rule := []string{"FORWARD", "-i", ns.Bridge, "-o", ns.Bridge, "-j", "ACCEPT"}
	for _, ipt := range []string{"iptables", "iptables-legacy"} {
		if _, err := exec.LookPath(ipt); err != nil {
			continue
		}
		if exec.Command(ipt, append([]string{"-I"}, rule...)...).Run() == nil {
			t.Cleanup(func() { exec.Command(ipt, append([]string{"-D"}, rule...)...).Run() })
		}
	}
	for h := 1; h <= n; h++ {
		name := fmt.Sprintf("k%dh%d", id, h)
		veth := fmt.Sprintf("kv%dh%d", id, h)
		addr := fmt.Sprintf("10.77.%d.%d", subnet, h)
		ns.Names = append(ns.Names, name)
		ns.Addrs = append(ns.Addrs, addr)
		for _, s := range [][]string{
			{"netns", "add", name},
			{"link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", name},
			{"link", "set", veth, "master", ns.Bridge, "up"},
			{"-n", name, "addr", "add", addr + "/24", "dev", "eth0"},
			{"-n", name, "link", "set", "eth0", "up"},
			{"-n", name, "link", "set", "lo", "up"},
		} {
			if err := ip(s...); err != nil {
				t.Fatalf("netns host %d: %v", h, err)
			}
		}
	}
	return ns
}

// Hosts places slots[i] ranks in namespace i; each namespace is a host named after its address.
func (ns *Netns) Hosts(slots ...int) []Host {
	hosts := make([]Host, len(slots))
	for i, s := range slots {
		hosts[i] = Host{Name: ns.Addrs[i], Slots: s, Wrap: []string{"ip", "netns", "exec", ns.Names[i]}}
	}
	return hosts
}
