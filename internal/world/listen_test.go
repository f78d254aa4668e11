package world

import (
	"context"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/jobenv"
	"github.com/kolo-dl/kolo/internal/rendezvous"
)

// A rank listens on the one address it reaches the rendezvous from, the one it publishes, not on
// every interface; beside a rendezvous on a Unix socket (a job on one host), on a Unix socket in
// the same directory.
func TestListensOnRouteToRendezvous(t *testing.T) {
	sockDir := t.TempDir()
	for _, tc := range []struct{ name, rendezvous, want string }{
		{"ipv4", "127.0.0.1:0", "127.0.0.1"},
		{"ipv6", "[::1]:0", "::1"},
		{"unix", filepath.Join(sockDir, "rendezvous.sock"), sockDir},
	} {
		t.Run(tc.name, func(t *testing.T) {
			secret := []byte("listen-test-secret")
			srv := rendezvous.NewServer(secret)
			addr, err := srv.Listen(tc.rendezvous)
			if err != nil {
				t.Skipf("no %s loopback here: %v", tc.name, err)
			}
			defer srv.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			hosts := []string{"a", "b"} // two hosts: the ranks meet over TCP
			worlds := make([]*World, len(hosts))
			errs := make([]error, len(hosts))
			var wg sync.WaitGroup
			for r := range hosts {
				wg.Add(1)
				go func() {
					defer wg.Done()
					job := jobenv.Job{Rank: r, Size: 2, LocalSize: 1, CrossRank: r, CrossSize: 2, Hostname: hosts[r],
						Rendezvous: addr.String(), JobID: "listen-test"}
					worlds[r], errs[r] = Connect(ctx, job, secret, Options{ShmDir: t.TempDir()})
				}()
			}
			wg.Wait()
			for r, w := range worlds {
				if errs[r] != nil {
					t.Fatalf("rank %d: %v", r, errs[r])
				}
				defer w.Close()
				switch a := w.ln.Addr().(type) {
				case *net.TCPAddr:
					if !a.IP.Equal(net.ParseIP(tc.want)) {
						t.Errorf("rank %d listens on %s, want %s", r, a, tc.want)
					}
				case *net.UnixAddr:
					if filepath.Dir(a.Name) != tc.want {
						t.Errorf("rank %d listens on Unix socket %s, want one in %s", r, a.Name, tc.want)
					}
				default:
					t.Errorf("rank %d listens on %s %s", r, a.Network(), a)
				}
			}
			// The ranks did connect: a message crosses the mesh.
			errs[0] = worlds[0].Comm.Send(ctx, 1, []byte("hi"))
			buf := make([]byte, 2)
			errs[1] = worlds[1].Comm.Recv(ctx, 0, buf)
			if errs[0] != nil || errs[1] != nil || string(buf) != "hi" {
				t.Fatalf("send %v, recv %v %q", errs[0], errs[1], buf)
			}
		})
	}
}
