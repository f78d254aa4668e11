package world

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/jobenv"
)

// A world of 3 hosts x 2 ranks costs the rendezvous one request per rank (its address table
// comes back whole), every rank learns every rank's host, and ranks of different hosts talk.
func TestStartupCostsOneRequestPerRank(t *testing.T) {
	const hosts, per = 3, 2
	const n = hosts * per
	secret := []byte("startup-test-secret")
	srv, ln := serveRendezvous(t, secret)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	worlds := make([]*World, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			job := jobenv.Job{Rank: r, Size: n, LocalRank: r % per, LocalSize: per, CrossRank: r / per, CrossSize: hosts,
				Hostname: fmt.Sprintf("host%d", r/per), Rendezvous: ln, JobID: "startup-test"}
			worlds[r], errs[r] = Connect(ctx, job, secret, Options{NoShm: true, Timeout: 20 * time.Second})
		}()
	}
	wg.Wait()
	for r := range n {
		if errs[r] != nil {
			t.Fatalf("rank %d: %v", r, errs[r])
		}
		defer worlds[r].Close()
	}
	if got := srv.Requests(); got != n {
		t.Errorf("start-up of %d ranks cost the rendezvous %d requests, want %d", n, got, n)
	}
	for r, w := range worlds {
		if w.Hosts[n-1] != "host2" || w.Hosts[0] != "host0" {
			t.Errorf("rank %d's host table: %v", r, w.Hosts)
		}
	}
	done := make(chan error, 1)
	go func() { done <- worlds[n-1].Comm.Send(ctx, 0, []byte("hello")) }()
	buf := make([]byte, 5)
	if err := worlds[0].Comm.Recv(ctx, n-1, buf); err != nil || string(buf) != "hello" {
		t.Fatalf("rank 0 from rank %d: %q, %v", n-1, buf, err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
