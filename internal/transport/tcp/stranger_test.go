package tcp_test

import (
	"path/filepath"
	"testing"

	"github.com/kolo-dl/kolo/internal/transport/tcp"
	"github.com/kolo-dl/kolo/testbed/authtest"
)

// A stranger at a rank's port gets no proof computed from the secret: a one-byte refusal for a
// wrong proof, nothing while it stays silent; on TCP, and on the Unix socket of a rank of a job on
// one host.
func TestStrangerGetsNoProof(t *testing.T) {
	for _, at := range []string{"127.0.0.1:0", filepath.Join(t.TempDir(), "r0.sock")} {
		t.Run(at, func(t *testing.T) {
			ln, err := tcp.Listen(at, []byte("0123456789abcdef0123456789abcdef"))
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			authtest.RevealsNothing(t, ln.Addr().String())
		})
	}
}
