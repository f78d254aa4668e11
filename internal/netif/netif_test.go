package netif

import (
	"net"
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

func TestAddressHere(t *testing.T) {
	var mine string // a non-loopback address of this machine, if it has one
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && !ipn.IP.IsLoopback() && !ipn.IP.IsLinkLocalUnicast() {
				mine = ipn.IP.String()
				break
			}
		}
	}
	tests := []struct {
		host string
		want string // "": none
	}{
		{"127.0.0.1", ""}, {"localhost", ""}, // loopback reaches no other machine
		{"192.0.2.7", ""}, // TEST-NET-1: not here
		{"kolo-no-such-host.invalid", ""},
	}
	if mine != "" {
		tests = append(tests, struct{ host, want string }{mine, mine}, struct{ host, want string }{"user@" + mine, mine})
	}
	for _, tc := range tests {
		ip, ok := AddressHere(tc.host)
		if ok != (tc.want != "") || (ok && ip.String() != tc.want) {
			t.Errorf("AddressHere(%q) = %v, %v; want %q", tc.host, ip, ok, tc.want)
		}
	}
}
