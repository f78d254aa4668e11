package netif

import (
	"strings"
	"testing"
)

func TestInterfaceIP(t *testing.T) {
	ip, name, err := InterfaceIP(" kolo-absent0 , lo")
	if err != nil || name != "lo" || !ip.IsLoopback() || ip.To4() == nil {
		t.Errorf("InterfaceIP(absent, lo) = %v %q %v; want lo's IPv4 address", ip, name, err)
	}
	_, _, err = InterfaceIP("kolo-absent0,kolo-absent1")
	if err == nil || !strings.Contains(err.Error(), "this host has: ") || !strings.Contains(err.Error(), "lo") {
		t.Errorf("absent interfaces: got %v, want an error listing the host's interfaces", err)
	}
	if _, _, err := InterfaceIP(" , "); err == nil {
		t.Error("an empty list was accepted")
	}
}

func TestSourceIPAndIsThisMachine(t *testing.T) {
	ip, err := SourceIP("user@127.0.0.1")
	if err != nil || !ip.IsLoopback() {
		t.Errorf("SourceIP(loopback) = %v, %v", ip, err)
	}
	for host, want := range map[string]bool{
		"localhost": true, "127.0.0.1": true, "root@127.0.0.1": true,
		"192.0.2.7": false, // TEST-NET-1: never assigned to a real interface
	} {
		if got := IsThisMachine(host); got != want {
			t.Errorf("IsThisMachine(%q) = %v, want %v", host, got, want)
		}
	}
	if _, err := SourceIP("kolo-no-such-host.invalid"); err == nil {
		t.Error("SourceIP of a name that does not resolve succeeded")
	}
}
