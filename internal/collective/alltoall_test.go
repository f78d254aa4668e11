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

func TestAlltoall(t *testing.T) {
	for _, mode := range exchangeModes {
		for _, n := range rankCounts {
			testAlltoall(t, mode.name, n, mode.opts, mode.comm, mode.tun)
		}
	}
}

func testAlltoall(t *testing.T, mode string, n int, opts []inmem.Option, comm func(*inmem.Endpoint) transport.Comm, tun *Tuning) {
	{
		t.Run(fmt.Sprintf("%s/n=%d", mode, n), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(n), 13))
			for _, maxCount := range []int{0, 3, 100, 200_000} {
				// split[r][q] bytes go from rank r to rank q; about a quarter are zero.
				split := make([][]int, n)
				blocks := make([][][]byte, n)
				for r := range split {
					split[r] = make([]int, n)
					blocks[r] = make([][]byte, n)
					for q := range split[r] {
						if maxCount > 0 && rng.IntN(4) != 0 {
							split[r][q] = rng.IntN(maxCount + 1)
						}
						blocks[r][q] = randomBytes(rng, split[r][q])
					}
				}
				recvs := make([][]byte, n)
				mustRanks(t, n, opts, comm, func(ctx context.Context, r int, c transport.Comm) error {
					var send []byte
					recvCounts := make([]int, n)
					for q := range n {
						send = append(send, blocks[r][q]...)
						recvCounts[q] = split[q][r]
					}
					recvs[r] = make([]byte, sum(recvCounts))
					return Alltoall(ctx, c, send, split[r], recvs[r], recvCounts, tun)
				})
				for r := range n {
					var want []byte
					for q := range n {
						want = append(want, blocks[q][r]...)
					}
					if !bytes.Equal(recvs[r], want) {
						t.Errorf("max count %d: rank %d received the wrong bytes", maxCount, r)
					}
				}
			}
		})
	}
}

func TestAlltoallRejectsBadCounts(t *testing.T) {
	c := inmem.New(2)[0]
	ctx := context.Background()
	if err := Alltoall(ctx, c, make([]byte, 2), []int{1, 1}, make([]byte, 2), []int{2, 0}, nil); err == nil {
		t.Error("accepted a self block whose send and recv sizes differ")
	}
	if err := Alltoall(ctx, c, make([]byte, 2), []int{1, 1}, make([]byte, 3), []int{1, 1}, nil); err == nil {
		t.Error("accepted a recv buffer longer than the counts")
	}
	if err := Alltoall(ctx, c, make([]byte, 2), []int{2}, make([]byte, 2), []int{1, 1}, nil); err == nil {
		t.Error("accepted one send count for two ranks")
	}
}
