package collective

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/kolo-dl/kolo/internal/transport"
	"github.com/kolo-dl/kolo/internal/transport/inmem"
)

func TestBroadcast(t *testing.T) {
	tunings := []struct {
		name string
		tun  *Tuning
	}{
		{"default", nil},
		{"tree", &Tuning{SmallBroadcastBytes: 1 << 30}},
		{"chain", &Tuning{SmallBroadcastBytes: 1}},
	}
	for _, mode := range exchangeModes {
		for _, n := range rankCounts {
			testBroadcast(t, mode.name, n, mode.opts, mode.comm, mode.tun, tunings)
		}
	}
}

func testBroadcast(t *testing.T, mode string, n int, opts []inmem.Option, comm func(*inmem.Endpoint) transport.Comm, modeTun *Tuning,
	tunings []struct {
		name string
		tun  *Tuning
	}) {
	{
		t.Run(fmt.Sprintf("%s/n=%d", mode, n), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(n), 17))
			for _, size := range []int{0, 1, 13, 1000, 70_001, 600_003, 3<<20 + 7} {
				if size > 1<<20 && testing.Short() {
					continue
				}
				data := randomBytes(rng, size)
				for _, tn := range tunings {
					roots := n
					if size > 1<<20 { // the large case once per shape, from the last rank
						if tn.tun != nil {
							continue
						}
						roots = 1
					}
					if mode != "rings" && tn.tun != nil {
						continue // the tunings choose between the ring algorithms
					}
					mustRanks(t, n, opts, comm, func(ctx context.Context, r int, c transport.Comm) error {
						for i := range roots {
							root := n - 1 - i
							buf := make([]byte, size)
							if r == root {
								copy(buf, data)
							}
							tun := tn.tun
							if tun == nil {
								tun = modeTun
							}
							if err := Broadcast(ctx, c, buf, root, tun); err != nil {
								return fmt.Errorf("root %d: %w", root, err)
							}
							if !bytes.Equal(buf, data) {
								return fmt.Errorf("%s, %d bytes from root %d: rank %d received the wrong bytes", tn.name, size, root, r)
							}
						}
						return nil
					})
				}
			}
		})
	}
}

func TestBroadcastRejectsBadRoot(t *testing.T) {
	c := inmem.New(2)[0]
	for _, root := range []int{-1, 2} {
		if err := Broadcast(context.Background(), c, make([]byte, 4), root, nil); err == nil {
			t.Errorf("root %d accepted", root)
		}
	}
}
