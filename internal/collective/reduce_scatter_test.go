package collective

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kolo-dl/kolo/internal/dtype"
	"github.com/kolo-dl/kolo/internal/reduce"
	"github.com/kolo-dl/kolo/internal/transport"
	"github.com/kolo-dl/kolo/internal/transport/inmem"
)

func TestReduceScatter(t *testing.T) {
	for _, mode := range exchangeModes {
		for _, n := range rankCounts {
			testReduceScatter(t, mode.name, n, mode.opts, mode.comm, mode.tun)
		}
	}
}

func testReduceScatter(t *testing.T, mode string, n int, opts []inmem.Option, comm func(*inmem.Endpoint) transport.Comm, tun *Tuning) {
	{
		t.Run(fmt.Sprintf("%s/n=%d", mode, n), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(n), 19))
			type rsCase struct {
				t      dtype.DType
				op     reduce.Op
				counts []int // bytes
				inputs [][]byte
			}
			var cases []rsCase
			for _, dt := range testDTypes {
				for _, op := range testOps {
					for _, maxElems := range []int{0, 1, 40, 100_000} {
						counts := make([]int, n)
						for r := range counts {
							if maxElems > 0 && rng.IntN(4) != 0 {
								counts[r] = rng.IntN(maxElems+1) * dt.Size()
							}
						}
						if maxElems == 100_000 && (dt != dtype.Float32 || op != reduce.Sum) {
							continue // one large case is enough
						}
						c := rsCase{t: dt, op: op, counts: counts}
						for range n {
							c.inputs = append(c.inputs, genInput(rng, dt, op, sum(counts)/dt.Size()))
						}
						cases = append(cases, c)
					}
				}
			}
			outs := make([][][]byte, len(cases))
			for i := range outs {
				outs[i] = make([][]byte, n)
			}
			mustRanks(t, n, opts, comm, func(ctx context.Context, r int, c transport.Comm) error {
				for i, tc := range cases {
					send := slices.Clone(tc.inputs[r])
					recv := make([]byte, tc.counts[r])
					if err := ReduceScatter(ctx, c, send, recv, tc.counts, tc.t, tc.op, tun); err != nil {
						return fmt.Errorf("%v %v counts %v: %w", tc.t, tc.op, tc.counts, err)
					}
					if !bytes.Equal(send, tc.inputs[r]) {
						return fmt.Errorf("%v %v counts %v: send was modified", tc.t, tc.op, tc.counts)
					}
					outs[i][r] = recv
				}
				return nil
			})
			for i, tc := range cases {
				off := 0
				for r := range n {
					block := make([][]byte, n)
					for q := range n {
						block[q] = tc.inputs[q][off : off+tc.counts[r]]
					}
					if msg := checkReduced(tc.t, tc.op, outs[i][r], block); msg != "" {
						t.Errorf("%v %v counts %v, rank %d: %s", tc.t, tc.op, tc.counts, r, msg)
					}
					off += tc.counts[r]
				}
			}
		})
	}
}

func TestReduceScatterRejectsBadCounts(t *testing.T) {
	c := inmem.New(2)[0]
	ctx := context.Background()
	if err := ReduceScatter(ctx, c, make([]byte, 8), make([]byte, 4), []int{4, 3}, dtype.Float32, reduce.Sum, nil); err == nil {
		t.Error("accepted a count that is not whole elements")
	}
	if err := ReduceScatter(ctx, c, make([]byte, 8), make([]byte, 8), []int{4, 4}, dtype.Float32, reduce.Sum, nil); err == nil {
		t.Error("accepted a recv buffer longer than its count")
	}
}
