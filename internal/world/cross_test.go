package world

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/jobenv"
)

// Under mpirun the launcher does not say which hosts run which ranks (CrossSize 0): Connect
// derives the cross rank and size from the hosts the ranks publish.
func TestConnectDerivesCrossRank(t *testing.T) {
	secret := []byte("cross-test-secret")
	_, addr := serveRendezvous(t, secret)
	hosts := []string{"a", "a", "b"} // a runs local ranks 0 and 1, b only local rank 0
	local := []int{0, 1, 0}
	localSize := []int{2, 2, 1}
	want := [][2]int{{0, 2}, {0, 1}, {1, 2}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	shmDir := t.TempDir()
	var wg sync.WaitGroup
	worlds := make([]*World, 3)
	errs := make([]error, 3)
	for r := range hosts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			job := jobenv.Job{Rank: r, Size: 3, LocalRank: local[r], LocalSize: localSize[r], Hostname: hosts[r],
				Rendezvous: addr, JobID: "cross-test"}
			worlds[r], errs[r] = Connect(ctx, job, secret, Options{ShmDir: shmDir})
		}()
	}
	wg.Wait()
	for r := range hosts {
		if errs[r] != nil {
			t.Fatalf("rank %d: %v", r, errs[r])
		}
		defer worlds[r].Close()
		if got := [2]int{worlds[r].Job.CrossRank, worlds[r].Job.CrossSize}; got != want[r] {
			t.Errorf("rank %d: cross %v, want %v", r, got, want[r])
		}
	}
}
