package collective

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kolo-dl/kolo/internal/transport"
	"github.com/kolo-dl/kolo/internal/transport/inmem"
)

func TestAllgather(t *testing.T) {
	for _, mode := range exchangeModes {
		for _, n := range rankCounts {
			t.Run(fmt.Sprintf("%s/n=%d", mode.name, n), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(uint64(n), 11))
				var countSets [][]int
				for _, maxCount := range []int{0, 1, 50, 70_000} {
					counts := make([]int, n)
					for r := range counts {
						if maxCount > 0 && rng.IntN(4) != 0 { // about a quarter stay zero
							counts[r] = rng.IntN(maxCount + 1)
						}
					}
					countSets = append(countSets, counts)
				}
				if !testing.Short() && (n == 3 || n == 8) {
					countSets = append(countSets, slices.Repeat([]int{3<<20/n + 1}, n))
				}
				opts, comm := mode.opts, mode.comm
				sends := make([][][]byte, len(countSets))
				for i, counts := range countSets {
					for r := range n {
						sends[i] = append(sends[i], randomBytes(rng, counts[r]))
					}
				}
				recvs := make([][][]byte, len(countSets))
				for i := range recvs {
					recvs[i] = make([][]byte, n)
				}
				mustRanks(t, n, opts, comm, func(ctx context.Context, r int, c transport.Comm) error {
					for i, counts := range countSets {
						recv := make([]byte, sum(counts))
						if err := Allgather(ctx, c, sends[i][r], recv, counts, mode.tun); err != nil {
							return fmt.Errorf("counts %v: %w", counts, err)
						}
						// In place: send is recv's own block.
						inPlace := make([]byte, len(recv))
						off := sum(counts[:r])
						copy(inPlace[off:], sends[i][r])
						if err := Allgather(ctx, c, inPlace[off:off+counts[r]], inPlace, counts, mode.tun); err != nil {
							return fmt.Errorf("in place, counts %v: %w", counts, err)
						}
						if !bytes.Equal(inPlace, recv) {
							return fmt.Errorf("counts %v: in-place result differs", counts)
						}
						recvs[i][r] = recv
					}
					return nil
				})
				for i, counts := range countSets {
					want := slices.Concat(sends[i]...)
					for r := range n {
						if !bytes.Equal(recvs[i][r], want) {
							t.Errorf("counts %v: rank %d received the wrong bytes", counts, r)
						}
					}
				}
			})
		}
	}
}

func TestAllgatherRejectsBadCounts(t *testing.T) {
	c := inmem.New(2)[0]
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		send   []byte
		recv   []byte
		counts []int
	}{
		{"too few counts", make([]byte, 1), make([]byte, 2), []int{1}},
		{"negative count", make([]byte, 1), make([]byte, 0), []int{1, -1}},
		{"send length", make([]byte, 2), make([]byte, 2), []int{1, 1}},
		{"recv length", make([]byte, 1), make([]byte, 3), []int{1, 1}},
	} {
		if err := Allgather(ctx, c, tc.send, tc.recv, tc.counts, nil); err == nil {
			t.Errorf("%s: accepted", tc.name)
		}
	}
}

func sum(xs []int) int {
	s := 0
	for _, x := range xs {
		s += x
	}
	return s
}
