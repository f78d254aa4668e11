package world

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"reflect"
	"sync"
	"testing"

	"github.com/kolo-dl/kolo/internal/collective"
	"github.com/kolo-dl/kolo/internal/dtype"
	"github.com/kolo-dl/kolo/internal/reduce"
)

func TestEagerPeers(t *testing.T) {
	for _, tc := range []struct {
		name         string
		rank, size   int
		remote, want []int
		cross        []int
	}{
		{"rank 0 connects every remote rank", 0, 8, []int{2, 3, 4, 5, 6, 7}, []int{2, 3, 4, 5, 6, 7}, []int{0, 2, 4, 6}},
		{"a rank: coordinator, ring neighbours, cross peers", 3, 8, []int{0, 1, 4, 5, 6, 7}, []int{0, 1, 4, 5, 7}, []int{1, 3, 5, 7}},
		{"the last rank wraps to rank 0", 7, 8, []int{0, 1, 2, 3, 4, 5}, []int{0, 1, 3, 5}, []int{1, 3, 5, 7}},
		{"uneven hosts: no cross group", 2, 5, []int{0, 1, 4}, []int{0, 1}, nil},
		{"coordinator and a neighbour on this host", 1, 6, []int{2, 3, 4, 5}, []int{2, 3, 5}, []int{1, 3, 5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := eagerPeers(tc.rank, tc.size, tc.remote, tc.cross)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("eagerPeers = %v, want %v", got, tc.want)
			}
		})
	}
}

// A world connects at start-up only the remote ranks its collectives use at once, and each
// collective connects what it needs: the ring over the whole job and the hierarchical
// allreduce add nothing; an alltoall connects every pair. With FullMesh, everything at once.
func TestConnectOpensOnlyEagerPeers(t *testing.T) {
	secret := []byte("lazy-world-secret")
	_, addr := serveRendezvous(t, secret)
	const hosts, perHost = 4, 2
	var members []member
	for h := range hosts {
		for range perHost {
			members = append(members, member{host: fmt.Sprintf("h%d", h)})
		}
	}
	n := len(members)
	for _, full := range []bool{false, true} {
		t.Run(fmt.Sprintf("full mesh %v", full), func(t *testing.T) {
			worlds := formWith(t, addr, fmt.Sprintf("lazy-%v", full), secret, t.TempDir(), members,
				func(o *Options) { o.FullMesh = full })
			defer func() {
				for _, w := range worlds {
					w.Close()
				}
			}()
			want := func(r int) int {
				if full {
					return n - perHost
				}
				var remote []int
				for q := range n {
					if q/perHost != r/perHost {
						remote = append(remote, q)
					}
				}
				return len(eagerPeers(r, n, remote, crossGroup(worlds[r].Hosts, worlds[r].Job)))
			}
			check := func(after string) {
				t.Helper()
				for r, w := range worlds {
					if got := w.RemoteConnected(); got != want(r) {
						t.Errorf("%s: rank %d connected to %d remote ranks, want %d", after, r, got, want(r))
					}
				}
			}
			check("after Connect")
			allreduce(t, worlds, "ring", func(w *World, buf []byte) error {
				return collective.RingAllreduce(context.Background(), w.Comm, buf, dtype.Float32, reduce.Sum)
			})
			allreduce(t, worlds, "hierarchical", func(w *World, buf []byte) error {
				return collective.HierarchicalAllreduce(context.Background(), w.Local, w.Cross, buf, dtype.Float32, reduce.Sum, nil)
			})
			check("after the ring and hierarchical allreduces")
			each(t, worlds, func(r int, w *World) error {
				counts := make([]int, n)
				for i := range counts {
					counts[i] = 4
				}
				return collective.Alltoall(context.Background(), w.Comm, make([]byte, 4*n), counts, make([]byte, 4*n), counts, nil)
			})
			for r, w := range worlds {
				if got := w.RemoteConnected(); got != n-perHost {
					t.Errorf("after an alltoall: rank %d connected to %d remote ranks, want all %d", r, got, n-perHost)
				}
			}
		})
	}
}

// allreduce runs f on every rank with a buffer of its rank+1 and checks the sum.
func allreduce(t *testing.T, worlds []*World, name string, f func(w *World, buf []byte) error) {
	t.Helper()
	n := len(worlds)
	each(t, worlds, func(r int, w *World) error {
		buf := make([]byte, 4*1000)
		for i := range 1000 {
			binary.LittleEndian.PutUint32(buf[4*i:], math.Float32bits(float32(r+1)))
		}
		if err := f(w, buf); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		want := float32(n * (n + 1) / 2)
		for i := range 1000 {
			if got := math.Float32frombits(binary.LittleEndian.Uint32(buf[4*i:])); got != want {
				return fmt.Errorf("%s: element %d is %v, want %v", name, i, got, want)
			}
		}
		return nil
	})
}

func each(t *testing.T, worlds []*World, f func(r int, w *World) error) {
	t.Helper()
	errs := make([]error, len(worlds))
	var wg sync.WaitGroup
	for r, w := range worlds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = f(r, w)
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}
