package world

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/jobenv"
	"github.com/kolo-dl/kolo/internal/rendezvous"
)

// With Interface set, a rank listens on and advertises that interface's address, whatever address
// it reaches the rendezvous from; an interface this host lacks is an error naming the list.
func TestConnectInterface(t *testing.T) {
	// The ranks reach the rendezvous through one of this machine's own non-loopback addresses (the
	// kernel keeps that traffic local), so what they advertise without Interface would not be lo's.
	var own net.IP
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil && !ipn.IP.IsLoopback() {
				own = ipn.IP
				break
			}
		}
	}
	if own == nil {
		t.Skip("this machine has no non-loopback IPv4 address")
	}
	secret := []byte("iface-test-secret")
	srv := rendezvous.NewServer(secret)
	ln, err := srv.Listen(net.JoinHostPort(own.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	addr := ln.(*net.TCPAddr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	_, err = Connect(ctx, jobenv.Job{Rank: 0, Size: 2, LocalSize: 1, CrossSize: 2, Hostname: "a", Rendezvous: addr.String(), JobID: "x"},
		secret, Options{Interface: "kolo-no-such0,kolo-no-such1", Timeout: 5 * time.Second})
	if err == nil || !strings.Contains(err.Error(), `"kolo-no-such0,kolo-no-such1"`) || !strings.Contains(err.Error(), "lo") {
		t.Errorf("missing interface: got %v", err)
	}

	var wg sync.WaitGroup
	worlds := make([]*World, 2)
	errs := make([]error, 2)
	for r := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			job := jobenv.Job{Rank: r, Size: 2, LocalSize: 1, CrossRank: r, CrossSize: 2, Hostname: []string{"a", "b"}[r],
				Rendezvous: addr.String(), JobID: "iface-test"}
			// The first listed interface that exists is used.
			worlds[r], errs[r] = Connect(ctx, job, secret, Options{Interface: "kolo-no-such0,lo"})
		}()
	}
	wg.Wait()
	for r := range 2 {
		if errs[r] != nil {
			t.Fatalf("rank %d: %v", r, errs[r])
		}
		defer worlds[r].Close()
		v, err := srv.Get(ctx, RecordKey("iface-test", r))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(string(v), "127.0.0.1:") {
			t.Errorf("rank %d advertises %q, want lo's 127.0.0.1", r, v)
		}
	}
}
