package world

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/jobenv"
	"github.com/kolo-dl/kolo/internal/transport"
)

// member is one rank's place in a world.
type member struct {
	host string
}

// form connects a world of members (rank r is members[r]) under job id job.
func form(t *testing.T, addr, job string, secret []byte, shmDir string, members []member) []*World {
	t.Helper()
	return formWith(t, addr, job, secret, shmDir, members, nil)
}

// formWith is form with each rank's Options changed by edit first.
func formWith(t testing.TB, addr, job string, secret []byte, shmDir string, members []member, edit func(*Options)) []*World {
	t.Helper()
	n := len(members)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	worlds := make([]*World, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r, m := range members {
		local, localSize := 0, 0
		for q, o := range members {
			if o.host == m.host {
				if q < r {
					local++
				}
				localSize++
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			j := jobenv.Job{Rank: r, Size: n, LocalRank: local, LocalSize: localSize, Hostname: m.host, Rendezvous: addr, JobID: job}
			opt := Options{ShmDir: shmDir}
			if edit != nil {
				edit(&opt)
			}
			worlds[r], errs[r] = Connect(ctx, j, secret, opt)
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("%s: rank %d: %v", job, r, err)
		}
	}
	return worlds
}

// ring sends a message from every rank to the next over the job's routed group and checks it.
func ring(t *testing.T, worlds []*World, tag string) {
	t.Helper()
	n := len(worlds)
	var wg sync.WaitGroup
	errs := make([]error, n)
	for r, w := range worlds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			send := bytes.Repeat([]byte(fmt.Sprintf("%s from %d;", tag, r)), 50000)
			want := bytes.Repeat([]byte(fmt.Sprintf("%s from %d;", tag, (r+n-1)%n)), 50000)
			got := make([]byte, len(want))
			if err := w.Comm.SendRecv(ctx, (r+1)%n, send, (r+n-1)%n, got); err != nil {
				errs[r] = err
			} else if !bytes.Equal(got, want) {
				errs[r] = fmt.Errorf("got %.30q..., want %.30q...", got, want)
			}
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("%s: rank %d: %v", tag, r, err)
		}
	}
}

// An elastic job's next world is a new world: the survivors of one close it and connect the next,
// with new ranks and a newcomer, on the same listeners' hosts.
func TestNextWorldAfterClose(t *testing.T) {
	secret := []byte("next-world-secret")
	_, addr := serveRendezvous(t, secret)
	shmDir := t.TempDir()

	w1 := form(t, addr, "round-1", secret, shmDir, []member{{host: "a"}, {host: "a"}, {host: "b"}, {host: "b"}})
	ring(t, w1, "round 1")
	for r, w := range w1 {
		if err := w.Close(); err != nil {
			t.Fatalf("rank %d: close: %v", r, err)
		}
	}
	// Round 2: old rank 3 first, then host a's two; and a newcomer on host c.
	w2 := form(t, addr, "round-2", secret, shmDir, []member{{host: "b"}, {host: "a"}, {host: "a"}, {host: "c"}})
	defer func() {
		for _, w := range w2 {
			w.Close()
		}
	}()
	ring(t, w2, "round 2")
}

// A peer that first dials a rank after that rank's world closed (here ranks 3 and 6, which no
// collective had connected) learns it at once, as it would had they been connected, instead of
// retrying the port until its connect timeout (20 s here): the closed world no longer listens,
// and the refused dial names the rank and its host.
func TestClosedRankFailsLateDials(t *testing.T) {
	secret := []byte("late-dial-secret")
	_, addr := serveRendezvous(t, secret)
	var members []member
	for h := range 4 {
		members = append(members, member{host: fmt.Sprintf("h%d", h)}, member{host: fmt.Sprintf("h%d", h)})
	}
	worlds := formWith(t, addr, "late-dial", secret, t.TempDir(), members,
		func(o *Options) { o.Timeout = 20 * time.Second })
	defer func() {
		for _, w := range worlds {
			w.Close()
		}
	}()
	if err := worlds[6].Close(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	start := time.Now()
	err := worlds[3].Comm.Send(ctx, 6, []byte("late"))
	var pe *transport.PeerError
	ok := errors.As(err, &pe) && pe.Rank == 6 && pe.Host == "h3" && strings.Contains(err.Error(), "nothing listens there any more")
	if took := time.Since(start); !ok || took > 5*time.Second {
		t.Fatalf("send to rank 6 after its world closed: %v after %v; want it named at once (within 5 s)", err, took.Round(time.Millisecond))
	}
}
