package collective

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/kolo-dl/kolo/internal/dtype"
	"github.com/kolo-dl/kolo/internal/reduce"
	"github.com/kolo-dl/kolo/internal/transport"
	"github.com/kolo-dl/kolo/internal/transport/inmem"
)

// hostLayout builds hosts x perHost ranks and returns, for global rank g = h*perHost + l, its local
// and cross Comms, plus a function that closes everything.
type hostLayout func(hosts, perHost int) (local, cross []transport.Comm, kill func(g int, err error), done func())

// separateGroups is the production shape: one shared-memory group per host, one message-passing
// group per local rank across hosts.
func separateGroups(localOpts ...inmem.Option) hostLayout {
	return func(hosts, perHost int) ([]transport.Comm, []transport.Comm, func(int, error), func()) {
		locals := make([][]*inmem.Endpoint, hosts)
		for h := range locals {
			locals[h] = inmem.New(perHost, localOpts...)
		}
		crosses := make([][]*inmem.Endpoint, perHost)
		for l := range crosses {
			crosses[l] = inmem.New(hosts, inmem.WithoutShared())
		}
		local, cross := make([]transport.Comm, hosts*perHost), make([]transport.Comm, hosts*perHost)
		for h := range hosts {
			for l := range perHost {
				local[h*perHost+l] = locals[h][l]
				cross[h*perHost+l] = crosses[l][h].Comm()
			}
		}
		kill := func(g int, err error) {
			locals[g/perHost][g%perHost].Kill(err)
			crosses[g%perHost][g/perHost].Kill(err)
		}
		done := func() {
			for _, g := range append(slices.Concat(locals...), slices.Concat(crosses...)...) {
				g.Close()
			}
		}
		return local, cross, kill, done
	}
}

// subViews carves both levels out of one world group with transport.Sub; the local views are
// strict sub-groups, so they are not Shared and the ring phases run.
func subViews(hosts, perHost int) ([]transport.Comm, []transport.Comm, func(int, error), func()) {
	world := inmem.New(hosts * perHost)
	local, cross := make([]transport.Comm, len(world)), make([]transport.Comm, len(world))
	for g, e := range world {
		h, l := g/perHost, g%perHost
		var lm, cm []int
		for i := range perHost {
			lm = append(lm, h*perHost+i)
		}
		for i := range hosts {
			cm = append(cm, i*perHost+l)
		}
		var err error
		if local[g], err = transport.Sub(e, lm); err != nil {
			panic(err)
		}
		if cross[g], err = transport.Sub(e, cm); err != nil {
			panic(err)
		}
	}
	kill := func(g int, err error) { world[g].Kill(err) }
	done := func() {
		for _, e := range world {
			e.Close()
		}
	}
	return local, cross, kill, done
}

// hierLayouts are the host layouts every hierarchical test runs on.
var hierLayouts = []struct {
	name   string
	layout hostLayout
}{
	{"shared-local", separateGroups()},
	{"shared-local-small-slots", separateGroups(inmem.WithSlotBytes(200))},
	{"plain-local", separateGroups(inmem.WithoutShared())},
	{"sub-views", subViews},
}

func TestHierarchicalAllreduce(t *testing.T) {
	for _, lay := range hierLayouts {
		for _, shape := range [][2]int{{2, 2}, {3, 2}, {2, 3}, {1, 3}, {3, 1}} {
			hosts, perHost := shape[0], shape[1]
			t.Run(fmt.Sprintf("%s/%dx%d", lay.name, hosts, perHost), func(t *testing.T) {
				n := hosts * perHost
				rng := rand.New(rand.NewPCG(uint64(n), 7))
				cases := makeCases(rng, n, testDTypes, testOps, awkwardSizes(n))
				if !testing.Short() && lay.name != "shared-local-small-slots" && hosts > 1 && perHost > 1 {
					cases = append(cases, makeCases(rng, n, []dtype.DType{dtype.Float32}, []reduce.Op{reduce.Sum}, []int{3<<20/4 + 1})...)
				}
				for _, tun := range []*Tuning{nil, {SmallAllreduceBytes: 1}} {
					runHierarchical(t, lay.layout, hosts, perHost, tun, cases)
				}
			})
		}
	}
}

func runHierarchical(t *testing.T, layout hostLayout, hosts, perHost int, tun *Tuning, cases []*allreduceCase) {
	t.Helper()
	n := hosts * perHost
	local, cross, kill, done := layout(hosts, perHost)
	defer done()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	outs := make([][][]byte, len(cases))
	for i := range outs {
		outs[i] = make([][]byte, n)
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for g := range n {
		wg.Go(func() {
			for i, tc := range cases {
				buf := slices.Clone(tc.inputs[g])
				if err := HierarchicalAllreduce(ctx, local[g], cross[g], buf, tc.t, tc.op, tun); err != nil {
					errs[g] = fmt.Errorf("%v: %w", tc, err)
					kill(g, err)
					return
				}
				outs[i][g] = buf
			}
		})
	}
	wg.Wait()
	for g, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", g, err)
		}
	}
	for i, tc := range cases {
		if msg := checkTiled(tc.t, tc.op, outs[i][0], tc.inputs); msg != "" {
			t.Errorf("%v, rank 0: %s", tc, msg)
		}
		if msg := sameOnAllRanks(outs[i]); msg != "" {
			t.Errorf("%v: %s", tc, msg)
		}
	}
}

func TestHierarchicalAllreduceNamesLostRank(t *testing.T) {
	local, cross, kill, done := separateGroups()(2, 2)
	defer done()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	// Rank 3 (host 1, local rank 1) died before the op. Rank 1 (its cross peer) and rank 2 (its
	// host peer) see it as rank 1 of their groups; each survivor that fails dies too, as its
	// engine would abort, so rank 0 hears of it from its own local or cross peer, rank 1 of
	// those groups as well.
	kill(3, fmt.Errorf("host 1 rebooted"))
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for g := range 3 {
		wg.Go(func() {
			buf := make([]byte, 4096)
			errs[g] = HierarchicalAllreduce(ctx, local[g], cross[g], buf, dtype.Float32, reduce.Sum, nil)
			if errs[g] != nil {
				kill(g, errs[g])
			}
		})
	}
	wg.Wait()
	for g, err := range errs {
		wantPeerLost(t, fmt.Sprintf("rank %d", g), err, 1)
	}
}

// HierarchicalAllreduceScaled gives the bits of HierarchicalAllreduce followed by reduce.Scale.
func TestHierarchicalAllreduceScaledMatchesThenScale(t *testing.T) {
	for _, lay := range hierLayouts {
		for _, shape := range [][2]int{{2, 2}, {3, 2}, {1, 3}, {3, 1}} {
			hosts, perHost := shape[0], shape[1]
			t.Run(fmt.Sprintf("%s/%dx%d", lay.name, hosts, perHost), func(t *testing.T) {
				n := hosts * perHost
				rng := rand.New(rand.NewPCG(uint64(n), 9))
				cases := makeCases(rng, n, []dtype.DType{dtype.Float32, dtype.BFloat16, dtype.Int32},
					[]reduce.Op{reduce.Sum, reduce.Max}, append(awkwardSizes(n), 70_000))
				local, cross, kill, done := lay.layout(hosts, perHost)
				defer done()
				ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
				defer cancel()
				errs := make([]error, n)
				var wg sync.WaitGroup
				for g := range n {
					wg.Go(func() {
						for _, tc := range cases {
							want := slices.Clone(tc.inputs[g])
							err := HierarchicalAllreduce(ctx, local[g], cross[g], want, tc.t, tc.op, nil)
							reduce.Scale(tc.t, want, 1/float64(n))
							got := slices.Clone(tc.inputs[g])
							if err == nil {
								err = HierarchicalAllreduceScaled(ctx, local[g], cross[g], got, tc.t, tc.op, 1/float64(n), nil)
							}
							if err == nil && !slices.Equal(got, want) {
								err = fmt.Errorf("%v: rank %d's bits differ from HierarchicalAllreduce then Scale", tc, g)
							}
							if err != nil {
								errs[g] = err
								kill(g, err)
								return
							}
						}
					})
				}
				wg.Wait()
				for g, err := range errs {
					if err != nil {
						t.Errorf("rank %d: %v", g, err)
					}
				}
			})
		}
	}
}
