package rendezvous_test

import (
	"testing"

	"github.com/kolo-dl/kolo/internal/authtest"
	"github.com/kolo-dl/kolo/rendezvous"
)

// A stranger at the rendezvous (the launcher's, a node's, rank 0's under mpirun) gets no proof
// computed from the secret: a one-byte refusal for a wrong proof, nothing while it stays silent.
func TestStrangerGetsNoProof(t *testing.T) {
	srv := rendezvous.NewServer([]byte("0123456789abcdef0123456789abcdef"))
	defer srv.Close()
	addr, err := srv.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	authtest.RevealsNothing(t, addr.String())
}
