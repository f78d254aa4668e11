package world

import (
	"testing"

	"github.com/kolo-dl/kolo/internal/rendezvous"
)

// serveRendezvous starts a rendezvous for secret on loopback, closed at t's end, and returns
// its address.
func serveRendezvous(t *testing.T, secret []byte) (*rendezvous.Server, string) {
	t.Helper()
	srv := rendezvous.NewServer(secret)
	addr, err := srv.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return srv, addr.String()
}
