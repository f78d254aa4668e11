package rendezvous_test

import (
	"path/filepath"
	"testing"

	"github.com/kolo-dl/kolo/internal/rendezvous"
	"github.com/kolo-dl/kolo/testbed/authtest"
)

// A stranger at the rendezvous (the launcher's, a node's, rank 0's under mpirun) gets no proof
// computed from the secret: a one-byte refusal for a wrong proof, nothing while it stays silent;
// on TCP, and on the Unix socket of a job on one host (a stranger of the job's own user can
// connect there).
func TestStrangerGetsNoProof(t *testing.T) {
	for _, at := range []string{"127.0.0.1:0", filepath.Join(t.TempDir(), "rendezvous.sock")} {
		t.Run(at, func(t *testing.T) {
			srv := rendezvous.NewServer([]byte("0123456789abcdef0123456789abcdef"))
			defer srv.Close()
			addr, err := srv.Listen(at)
			if err != nil {
				t.Fatal(err)
			}
			authtest.RevealsNothing(t, addr.String())
		})
	}
}
