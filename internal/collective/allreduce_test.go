package collective

import (
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

type allreduceFunc func(ctx context.Context, c transport.Comm, buf []byte, t dtype.DType, op reduce.Op) error

// allreduceAlgos are the configurations every allreduce case runs under.
var allreduceAlgos = []struct {
	name string
	opts []inmem.Option
	comm func(*inmem.Endpoint) transport.Comm
	run  allreduceFunc
}{
	{"ring", []inmem.Option{inmem.WithoutShared()}, plainComm, RingAllreduce},
	{"recursive-doubling", []inmem.Option{inmem.WithoutShared()}, plainComm, RecursiveDoublingAllreduce},
	// Slots of 3 MiB: rounds of DefaultSharedRoundBytes, smaller than the slot.
	{"shared", []inmem.Option{inmem.WithSlotBytes(3 << 20)}, nil, sharedRun},
	// More ranks than CPUs: rounds as large as the slot.
	{"shared-oversubscribed", []inmem.Option{inmem.WithSlotBytes(2 << 20), inmem.WithOversubscribed()}, nil, sharedRun},
	// Slots of 100 bytes hold 12 float64s or 50 halves: many chunks, and slices that do not divide.
	{"shared-small-slots", []inmem.Option{inmem.WithSlotBytes(100)}, nil, sharedRun},
	{"auto-shared", nil, nil, autoRun(nil)},
	// The endpoint itself, with empty slots: Allreduce must notice it cannot use them.
	{"auto-plain", []inmem.Option{inmem.WithoutShared()}, nil, autoRun(nil)},
	{"auto-plain-ring-only", []inmem.Option{inmem.WithoutShared()}, plainComm, autoRun(&Tuning{SmallAllreduceBytes: 1})},
	// Pipes smaller than MinBuffered: only algorithms that never rely on buffering survive.
	{"ring-tiny-pipes", []inmem.Option{inmem.WithoutShared(), inmem.WithBuffer(3)}, plainComm, RingAllreduce},
	// Each way of writing the slots, as a config fixes it.
	{"auto-shared-streaming-stores", []inmem.Option{inmem.WithSlotBytes(3 << 20)}, nil, autoRun(&Tuning{SlotStores: SlotStoresStreaming})},
	{"auto-shared-plain-stores", []inmem.Option{inmem.WithSlotBytes(3 << 20)}, nil, autoRun(&Tuning{SlotStores: SlotStoresPlain})},
	// The smallest tuned rounds, and the shared algorithm down to the smallest buffers.
	{"auto-shared-small-rounds", []inmem.Option{inmem.WithSlotBytes(3 << 20)}, nil, autoRun(&Tuning{SmallAllreduceBytes: 1, SharedRoundBytes: 96})}, // taken as MinSharedRoundBytes
}

func sharedRun(ctx context.Context, c transport.Comm, buf []byte, t dtype.DType, op reduce.Op) error {
	return SharedAllreduce(ctx, c, c.(transport.Shared), buf, t, op)
}

func autoRun(tun *Tuning) allreduceFunc {
	return func(ctx context.Context, c transport.Comm, buf []byte, t dtype.DType, op reduce.Op) error {
		return Allreduce(ctx, c, buf, t, op, tun)
	}
}

type allreduceCase struct {
	t      dtype.DType
	op     reduce.Op
	elems  int
	inputs [][]byte // per rank
}

func (c *allreduceCase) String() string {
	return fmt.Sprintf("%v %v of %d elements", c.t, c.op, c.elems)
}

var (
	testDTypes = []dtype.DType{dtype.Float32, dtype.Float64, dtype.Int32, dtype.Int16, dtype.Uint8, dtype.Float16}
	testOps    = []reduce.Op{reduce.Sum, reduce.Min, reduce.Max, reduce.Prod}
)

// awkwardSizes are element counts that catch chunking mistakes for n ranks: empty, one element,
// odd, prime, one short of the rank count, not a multiple of it.
func awkwardSizes(n int) []int {
	sizes := []int{0, 1, 7, 13, 5*n + 3, 1009}
	if n > 2 {
		sizes = append(sizes, n-1)
	}
	slices.Sort(sizes)
	return slices.Compact(sizes)
}

func makeCases(rng *rand.Rand, n int, dts []dtype.DType, ops []reduce.Op, sizes []int) []*allreduceCase {
	var cases []*allreduceCase
	for _, t := range dts {
		for _, op := range ops {
			for _, elems := range sizes {
				c := &allreduceCase{t: t, op: op, elems: elems}
				for range n {
					c.inputs = append(c.inputs, genTiled(rng, t, op, elems))
				}
				cases = append(cases, c)
			}
		}
	}
	return cases
}

// runAllreduceCases runs every case, in order, on one group of n ranks, then checks each rank's
// result against the reference and against the other ranks' bits.
func runAllreduceCases(t *testing.T, n int, opts []inmem.Option, comm func(*inmem.Endpoint) transport.Comm,
	run allreduceFunc, cases []*allreduceCase) {
	t.Helper()
	outs := make([][][]byte, len(cases)) // [case][rank]
	for i := range outs {
		outs[i] = make([][]byte, n)
	}
	mustRanks(t, n, opts, comm, func(ctx context.Context, r int, c transport.Comm) error {
		for i, tc := range cases {
			buf := slices.Clone(tc.inputs[r])
			if err := run(ctx, c, buf, tc.t, tc.op); err != nil {
				return fmt.Errorf("%v: %w", tc, err)
			}
			outs[i][r] = buf
		}
		return nil
	})
	for i, tc := range cases {
		// Rank 0 against the reference, the others against rank 0's bits.
		if msg := checkTiled(tc.t, tc.op, outs[i][0], tc.inputs); msg != "" {
			t.Errorf("%v, rank 0: %s", tc, msg)
		}
		if msg := sameOnAllRanks(outs[i]); msg != "" {
			t.Errorf("%v: %s", tc, msg)
		}
	}
}

func TestAllreduceAlgorithms(t *testing.T) {
	for _, algo := range allreduceAlgos {
		for _, n := range rankCounts {
			t.Run(fmt.Sprintf("%s/n=%d", algo.name, n), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(uint64(n), 1))
				sizes := awkwardSizes(n)
				if algo.name == "ring-tiny-pipes" {
					sizes = []int{0, 1, 13, 5*n + 3}
				}
				runAllreduceCases(t, n, algo.opts, algo.comm, algo.run, makeCases(rng, n, testDTypes, testOps, sizes))
			})
		}
	}
}

// The other element types, once per algorithm.
func TestAllreduceOtherDTypes(t *testing.T) {
	others := []dtype.DType{dtype.BFloat16, dtype.Int8, dtype.Int64}
	for _, algo := range allreduceAlgos[:4] {
		t.Run(algo.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(5, 5))
			runAllreduceCases(t, 5, algo.opts, algo.comm, algo.run, makeCases(rng, 5, others, testOps, []int{1, 28, 1009}))
		})
	}
}

// Buffers of about 3 MiB: several shared-memory chunks, several ring segments per chunk.
func TestAllreduceLarge(t *testing.T) {
	if testing.Short() {
		t.Skip("large buffers in -short mode")
	}
	const elems32 = 3<<20/4 + 5 // ~3 MiB of float32, not a multiple of any rank count
	for _, algo := range allreduceAlgos[:4] {
		for _, n := range []int{3, 8} {
			t.Run(fmt.Sprintf("%s/n=%d", algo.name, n), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(uint64(n), 3))
				cases := makeCases(rng, n, []dtype.DType{dtype.Float32}, []reduce.Op{reduce.Sum}, []int{elems32})
				cases = append(cases, makeCases(rng, n, []dtype.DType{dtype.Float16}, []reduce.Op{reduce.Sum}, []int{elems32/2 - 1})...)
				cases = append(cases, makeCases(rng, n, []dtype.DType{dtype.Uint8}, []reduce.Op{reduce.Max}, []int{elems32 - 3})...)
				runAllreduceCases(t, n, algo.opts, algo.comm, algo.run, cases)
			})
		}
	}
}

func TestAllreduceRejectsBadArguments(t *testing.T) {
	c := inmem.New(1)[0]
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		buf  []byte
		t    dtype.DType
		op   reduce.Op
	}{
		{"partial element", make([]byte, 6), dtype.Float32, reduce.Sum},
		{"invalid dtype", make([]byte, 4), dtype.Invalid, reduce.Sum},
		{"invalid op", make([]byte, 4), dtype.Float32, 0},
		{"op out of range", make([]byte, 4), dtype.Float32, reduce.Prod + 1},
	} {
		for name, run := range map[string]allreduceFunc{
			"ring": RingAllreduce, "recursive doubling": RecursiveDoublingAllreduce, "shared": sharedRun, "auto": autoRun(nil),
		} {
			if err := run(ctx, c, tc.buf, tc.t, tc.op); err == nil {
				t.Errorf("%s: %s accepted it", tc.name, name)
			}
		}
	}
}

// min and max of +0 and -0 depend on operand order (reduce returns the later operand), so only
// an algorithm that combines in the same order on every rank leaves the same bits everywhere.
func TestAllreduceSignedZerosSameOnAllRanks(t *testing.T) {
	for _, algo := range allreduceAlgos {
		for _, n := range []int{2, 3, 4, 5, 8} {
			t.Run(fmt.Sprintf("%s/n=%d", algo.name, n), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(uint64(n), 23))
				var cases []*allreduceCase
				for _, dt := range []dtype.DType{dtype.Float32, dtype.Float16} {
					for _, op := range []reduce.Op{reduce.Min, reduce.Max} {
						c := &allreduceCase{t: dt, op: op, elems: 257}
						for range n {
							b := make([]byte, c.elems*dt.Size())
							for i := range c.elems {
								if rng.IntN(2) == 0 { // -0: only the sign bit
									b[(i+1)*dt.Size()-1] = 0x80
								}
							}
							c.inputs = append(c.inputs, b)
						}
						cases = append(cases, c)
					}
				}
				runAllreduceCases(t, n, algo.opts, algo.comm, algo.run, cases)
			})
		}
	}
}

// AllreduceScaled gives the bits of Allreduce followed by reduce.Scale, on every path: the shared
// one, which scales each slice where it is reduced, and the others, which scale afterwards.
func TestAllreduceScaledMatchesAllreduceThenScale(t *testing.T) {
	configs := []struct {
		name string
		opts []inmem.Option
		tun  *Tuning
	}{
		{"shared", []inmem.Option{inmem.WithSlotBytes(3 << 20)}, &Tuning{SmallAllreduceBytes: 1}},
		{"shared-small-slots", []inmem.Option{inmem.WithSlotBytes(100)}, &Tuning{SmallAllreduceBytes: 1}},
		{"shared-oversubscribed", []inmem.Option{inmem.WithSlotBytes(2 << 20), inmem.WithOversubscribed()}, &Tuning{SmallAllreduceBytes: 1}},
		{"ring", []inmem.Option{inmem.WithoutShared()}, &Tuning{SmallAllreduceBytes: 1}},
		{"default", nil, nil},
	}
	dts := []dtype.DType{dtype.Float32, dtype.Float64, dtype.Float16, dtype.BFloat16, dtype.Int32}
	for _, cfg := range configs {
		for _, n := range rankCounts {
			t.Run(fmt.Sprintf("%s/n=%d", cfg.name, n), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(uint64(n), 7))
				cases := makeCases(rng, n, dts, []reduce.Op{reduce.Sum, reduce.Max}, awkwardSizes(n))
				if n <= 3 { // several 1 MiB rounds
					cases = append(cases, makeCases(rng, n, []dtype.DType{dtype.Float32, dtype.BFloat16},
						[]reduce.Op{reduce.Sum}, []int{700_000})...)
				}
				for _, scale := range []float64{1 / float64(n), 0.37} {
					mustRanks(t, n, cfg.opts, nil, func(ctx context.Context, r int, c transport.Comm) error {
						for _, tc := range cases {
							want := slices.Clone(tc.inputs[r])
							if err := Allreduce(ctx, c, want, tc.t, tc.op, cfg.tun); err != nil {
								return fmt.Errorf("%v: %w", tc, err)
							}
							reduce.Scale(tc.t, want, scale)
							got := slices.Clone(tc.inputs[r])
							if err := AllreduceScaled(ctx, c, got, tc.t, tc.op, scale, cfg.tun); err != nil {
								return fmt.Errorf("%v scaled by %v: %w", tc, scale, err)
							}
							if !slices.Equal(got, want) {
								return fmt.Errorf("%v scaled by %v: rank %d's bits differ from Allreduce then Scale", tc, scale, r)
							}
						}
						return nil
					})
				}
			})
		}
	}
}
