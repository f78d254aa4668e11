package tcp_test

import (
	"testing"

	"github.com/kolo-dl/kolo/internal/authtest"
	"github.com/kolo-dl/kolo/transport/tcp"
)

// A stranger at a rank's port gets no proof computed from the secret: a one-byte refusal for a
// wrong proof, nothing while it stays silent.
func TestStrangerGetsNoProof(t *testing.T) {
	ln, err := tcp.Listen("127.0.0.1:0", []byte("0123456789abcdef0123456789abcdef"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	authtest.RevealsNothing(t, ln.Addr().String())
}
