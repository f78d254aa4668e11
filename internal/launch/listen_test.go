package launch

import (
	"net"
	"testing"

	"github.com/kolo-dl/kolo/internal/launch/flags"
	"github.com/kolo-dl/kolo/internal/rendezvous"
)

// The rendezvous listens on each address workers are told, at one port; a name listens on every
// interface only when it comes first.
func TestRendezvousListeners(t *testing.T) {
	if ln, err := net.Listen("tcp", "[::1]:0"); err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	} else {
		ln.Close()
	}
	t.Run("addresses", func(t *testing.T) {
		srv := rendezvous.NewServer([]byte("0123456789abcdef0123456789abcdef"))
		defer srv.Close()
		addrs, err := newRendezvousListeners(srv, "").atAll([]string{"::1", "127.0.0.1", "::1"})
		if err != nil {
			t.Fatal(err)
		}
		_, port, _ := net.SplitHostPort(addrs["127.0.0.1"])
		if len(addrs) != 2 || addrs["::1"] != net.JoinHostPort("::1", port) || port == "0" {
			t.Fatalf("addresses %v, want 127.0.0.1 and ::1 at one port", addrs)
		}
		for _, a := range addrs { // each one serves
			c, err := rendezvous.Dial(t.Context(), a, []byte("0123456789abcdef0123456789abcdef"))
			if err != nil {
				t.Fatalf("dial %s: %v", a, err)
			}
			c.Close()
		}
		// Every interface is not listened on: a third address of this machine is refused.
		if c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.2", port)); err == nil {
			c.Close()
			t.Errorf("127.0.0.2:%s accepts a connection: the rendezvous listens on every interface", port)
		}
	})
	t.Run("a name first", func(t *testing.T) {
		srv := rendezvous.NewServer([]byte("0123456789abcdef0123456789abcdef"))
		defer srv.Close()
		addrs, err := newRendezvousListeners(srv, "").atAll([]string{"127.0.0.1", "myhost"})
		if err != nil {
			t.Fatalf("a name beside an address: %v", err)
		}
		_, port, _ := net.SplitHostPort(addrs["myhost"])
		if addrs["127.0.0.1"] != "127.0.0.1:"+port {
			t.Errorf("addresses %v, want one port", addrs)
		}
		c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.2", port))
		if err != nil {
			t.Fatalf("a name listens on every interface, but 127.0.0.2:%s refuses: %v", port, err)
		}
		c.Close()
	})
}

// A no-ssh node serving --rendezvous HOST:PORT listens on HOST's address, not on every interface.
func TestServeHost(t *testing.T) {
	tests := []struct {
		host, iface, want string
	}{
		{"127.0.0.1", "", "127.0.0.1"},
		{"::1", "", "::1"},
		{"localhost", "", "127.0.0.1"},
		{"10.1.2.3", "lo", "10.1.2.3"}, // the address given wins over the interface
		{"kolo-no-such-host.invalid", "", ""},
		{"kolo-no-such-host.invalid", "lo", "127.0.0.1"},
	}
	for _, tc := range tests {
		n := &node{opts: &flags.Options{NetworkInterface: tc.iface}}
		got, err := n.serveHost(tc.host)
		if err != nil || got != tc.want {
			t.Errorf("serveHost(%q) with interface %q = %q, %v; want %q", tc.host, tc.iface, got, err, tc.want)
		}
	}
}
