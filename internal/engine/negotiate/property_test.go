package negotiate

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/dtype"
)

// opTmpl is one op of a simulated training loop, with what each rank submits at each step.
type opTmpl struct {
	name      string
	kind      OpKind
	dt        dtype.DType
	shape     []int64     // dims after 0 for allgather/alltoall
	rows      [][]int64   // [step][rank] dim 0, allgather/alltoall
	splits    [][][]int64 // [step][rank], alltoall; nil row: equal split
	reduceOp  uint8
	avg       bool
	pre, post float64
	root      int
	group     int64
	groupSize int
}

func (o *opTmpl) request(step, rank int) Request {
	r := Request{Name: o.name, Kind: o.kind, DType: o.dt, ReduceOp: o.reduceOp, Average: o.avg,
		PreScale: o.pre, PostScale: o.post, Root: o.root, Group: o.group, GroupSize: o.groupSize}
	if o.kind == Barrier {
		r.DType = 0
	}
	switch o.kind {
	case Allgather, Alltoall:
		r.Shape = append([]int64{o.rows[step][rank]}, o.shape...)
		if o.kind == Alltoall {
			r.Splits = o.splits[step][rank]
		}
	case Barrier:
	default:
		r.Shape = o.shape
	}
	return r
}

func randomOps(rng *rand.Rand, size, steps int) []*opTmpl {
	n := 1 + rng.IntN(30)
	ops := make([]*opTmpl, n)
	kinds := []OpKind{Allreduce, Allreduce, Allreduce, Allreduce, Allgather, Broadcast, ReduceScatter, Alltoall, Barrier}
	for i := range ops {
		o := &opTmpl{name: fmt.Sprintf("t%d.%d", i, rng.IntN(1000)), kind: kinds[rng.IntN(len(kinds))],
			dt: dtype.All[rng.IntN(len(dtype.All))]}
		nd := rng.IntN(3)
		if o.kind == Allgather || o.kind == Alltoall {
			nd = rng.IntN(2)
		}
		for range nd {
			o.shape = append(o.shape, int64(rng.IntN(6)))
		}
		if usesReduce(o.kind) {
			o.reduceOp = ReduceSum + uint8(rng.IntN(4))
			if o.reduceOp == ReduceSum && rng.IntN(2) == 0 {
				o.avg, o.post = true, 1/float64(size)
			}
			o.pre = []float64{0, 1, 0.5}[rng.IntN(3)]
		}
		if o.kind == Broadcast {
			o.root = rng.IntN(size)
		}
		if o.kind == Allgather || o.kind == Alltoall {
			change := rng.IntN(3) == 0 // rows change from step to step (a new signature)
			for s := range steps {
				if s > 0 && !change {
					o.rows = append(o.rows, o.rows[0])
					o.splits = append(o.splits, o.splits[0])
					continue
				}
				rows := make([]int64, size)
				splits := make([][]int64, size)
				for r := range rows {
					if o.kind == Alltoall && rng.IntN(2) == 0 {
						rows[r] = int64(rng.IntN(3) * size)
						continue // equal split
					}
					sp := make([]int64, size)
					for d := range sp {
						sp[d] = int64(rng.IntN(3))
						rows[r] += sp[d]
					}
					splits[r] = sp
				}
				if o.kind == Allgather {
					splits = nil
				}
				o.rows = append(o.rows, rows)
				o.splits = append(o.splits, splits)
			}
		}
		ops[i] = o
	}
	// Some allreduces become groups of 2 or 3 (members may differ in dtype).
	gid := int64(100)
	for i := 0; i+1 < len(ops); i++ {
		if rng.IntN(5) != 0 {
			continue
		}
		k := min(2+rng.IntN(2), len(ops)-i)
		for j := i; j < i+k; j++ {
			ops[j].group, ops[j].groupSize = gid, k
		}
		gid++
		i += k
	}
	return ops
}

// simRank is one rank's engine: its cache, what it still has to submit, what it has learned.
type simRank struct {
	cache   *Cache
	todo    [][2]int // (step, op), in this rank's submission order
	done    map[string]int
	inbox   [][]byte
	learned []Response
}

type sim struct {
	t         *testing.T
	rng       *rand.Rand
	ops       []*opTmpl
	byName    map[string]*opTmpl
	size      int
	steps     int
	cfg       Config
	co        *Coordinator
	ranks     []*simRank
	now       time.Time
	oneByOne  bool             // batches of one op, so that the reference below sees the same order
	ref       *Coordinator     // the same events with the cache off
	refOut    []Response       // its responses
	out       []Response       // the coordinator's responses
	batches   []int            // index in out where each Ready call's responses start
	log       [][]byte         // every batch sent, nil for a Ready call: for the replay check
	occur     map[string]int   // responses seen per name
	compact   int              // requests sent as ids
	groupSeen map[[2]int64]int // (group, step) -> the Ready batch its members came out in
	// toggles: the autotuner turns the cache off and on at random (SetCacheOff); cacheOff says
	// where in log, and to what.
	toggles  bool
	cacheOff map[int]bool
}

func newSim(t *testing.T, seed uint64) *sim {
	rng := rand.New(rand.NewPCG(seed, seed*7919+1))
	size := 2 + rng.IntN(7)
	steps := 3
	s := &sim{t: t, rng: rng, size: size, steps: steps, now: epoch, occur: map[string]int{}, oneByOne: seed%2 == 0,
		groupSeen: map[[2]int64]int{}, byName: map[string]*opTmpl{}, toggles: seed%3 == 1, cacheOff: map[int]bool{}}
	s.ops = randomOps(rng, size, steps)
	for _, o := range s.ops {
		s.byName[o.name] = o
	}
	s.cfg = Config{Size: size,
		FusionBytes:   []int64{64, 1 << 10, 0}[rng.IntN(3)],
		CacheCapacity: []int{-1, 2, 5, 0}[rng.IntN(4)],
		StallWarning:  -1}
	var err error
	if s.co, err = NewCoordinator(s.cfg); err != nil {
		t.Fatal(err)
	}
	refCfg := s.cfg
	refCfg.CacheCapacity = -1
	if s.ref, err = NewCoordinator(refCfg); err != nil {
		t.Fatal(err)
	}
	for r := 0; r < size; r++ {
		c, err := NewCache(r, size, s.cfg.CacheCapacity)
		if err != nil {
			t.Fatal(err)
		}
		sr := &simRank{cache: c, done: map[string]int{}}
		for step := range steps {
			for _, i := range rng.Perm(len(s.ops)) {
				sr.todo = append(sr.todo, [2]int{step, i})
			}
		}
		s.ranks = append(s.ranks, sr)
	}
	return s
}

// runnable is how many of r's next ops it may submit now: an op's next step waits until the rank
// has learned that the previous step's one completed, as a real training loop would.
func (s *sim) runnable(r int) int {
	sr := s.ranks[r]
	n := 0
	for _, it := range sr.todo {
		if sr.done[s.ops[it[1]].name] < it[0] {
			break
		}
		n++
	}
	return n
}

func (s *sim) submit(r, k int) {
	sr := s.ranks[r]
	var reqs []Request
	for _, it := range sr.todo[:k] {
		reqs = append(reqs, s.ops[it[1]].request(it[0], r))
	}
	sr.todo = sr.todo[k:]
	b := &Batch{}
	sr.cache.Compact(b, reqs...)
	s.compact += len(b.Cached)
	msg := EncodeBatch(nil, b)
	s.log = append(s.log, msg)
	got, err := DecodeBatch(msg)
	if err != nil {
		s.t.Fatalf("batch does not decode: %v", err)
	}
	if err := s.co.SubmitBatch(s.now, got); err != nil {
		s.t.Fatal(err)
	}
	if s.oneByOne {
		if err := s.ref.Submit(s.now, r, reqs...); err != nil {
			s.t.Fatal(err)
		}
	}
}

func (s *sim) ready() {
	s.log = append(s.log, nil)
	rs := s.co.Ready()
	if s.oneByOne {
		s.refOut = append(s.refOut, s.ref.Ready()...)
	}
	if len(rs) == 0 {
		return
	}
	s.batches = append(s.batches, len(s.out))
	s.out = append(s.out, rs...)
	msg := EncodeResponses(nil, rs)
	for _, sr := range s.ranks {
		sr.inbox = append(sr.inbox, msg)
	}
	for _, r := range rs {
		if r.Error != "" {
			s.t.Fatalf("error response: %s", r.Error)
		}
		for i, name := range r.Names {
			step := s.occur[name]
			s.occur[name]++
			s.checkAgainstTemplate(&r, i, step)
			if r.Group != 0 {
				key := [2]int64{r.Group, int64(step)}
				if b, ok := s.groupSeen[key]; ok && b != len(s.batches) {
					s.t.Fatalf("group %d step %d: members in Ready calls %d and %d", r.Group, step, b, len(s.batches))
				}
				s.groupSeen[key] = len(s.batches)
			}
		}
		s.checkFusion(&r)
	}
}

func (s *sim) checkAgainstTemplate(r *Response, i, step int) {
	o := s.byName[r.Names[i]]
	if o == nil || step >= s.steps {
		s.t.Fatalf("response #%d names %q (occurrence %d), which was not submitted that often", r.Seq, r.Names[i], step+1)
	}
	if r.Kind != o.kind || (o.kind != Barrier && r.DType != o.dt) || r.Group != o.group {
		s.t.Fatalf("response #%d: %q came out as %s %v group %d, want %s %v group %d", r.Seq, o.name, r.Kind, r.DType, r.Group, o.kind, o.dt, o.group)
	}
	switch o.kind {
	case Allgather, Alltoall:
		var total int64
		for _, v := range o.rows[step] {
			total += v
		}
		want := append([]int64{total}, o.shape...)
		if !slices.Equal(r.Shapes[i], want) {
			s.t.Fatalf("response #%d: %q shape %v, want %v", r.Seq, o.name, r.Shapes[i], want)
		}
		if o.kind == Allgather && !slices.Equal(r.Dim0[i], o.rows[step]) {
			s.t.Fatalf("response #%d: %q rows %v, want %v", r.Seq, o.name, r.Dim0[i], o.rows[step])
		}
		if o.kind == Alltoall {
			for src, row := range r.Splits {
				want := o.splits[step][src]
				if want == nil {
					want = equalSplit(o.rows[step][src], s.size)
				}
				if !slices.Equal(row, want) {
					s.t.Fatalf("response #%d: %q splits of rank %d %v, want %v", r.Seq, o.name, src, row, want)
				}
			}
		}
	case Barrier:
	default:
		if !slices.Equal(r.Shapes[i], o.shape) {
			s.t.Fatalf("response #%d: %q shape %v, want %v", r.Seq, o.name, r.Shapes[i], o.shape)
		}
	}
}

// checkFusion checks a response against the fusion rules, naively recomputed.
func (s *sim) checkFusion(r *Response) {
	if len(r.Names) == 1 {
		return
	}
	if r.Kind == Alltoall || r.Kind == Barrier || s.cfg.FusionBytes < 0 {
		s.t.Fatalf("response #%d fuses %d %s ops", r.Seq, len(r.Names), r.Kind)
	}
	var total int64
	for i, name := range r.Names {
		o := s.byName[name]
		if o.dt != r.DType || o.reduceOp != r.ReduceOp || o.root != r.Root || o.group != r.Group ||
			(usesReduce(o.kind) && scale(o.pre) != r.PreScale) {
			s.t.Fatalf("response #%d fuses %q, which differs from the group's parameters", r.Seq, name)
		}
		n := int64(r.DType.Size())
		for _, d := range r.Shapes[i] {
			n *= d
		}
		total += n
	}
	limit := s.cfg.FusionBytes
	if limit == 0 {
		limit = DefaultFusionBytes
	}
	if r.Group == 0 && total > limit {
		s.t.Fatalf("response #%d fuses %d bytes, over the %d-byte threshold", r.Seq, total, limit)
	}
}

func (s *sim) deliver(r, k int) {
	sr := s.ranks[r]
	for _, msg := range sr.inbox[:k] {
		rs, err := DecodeResponses(msg)
		if err != nil {
			s.t.Fatal(err)
		}
		for i := range rs {
			if err := sr.cache.Learn(&rs[i]); err != nil {
				s.t.Fatalf("rank %d: %v", r, err)
			}
			want := &s.out[rs[i].Seq-1]
			if a, b := formatResponse(&rs[i]), formatResponse(want); a != b {
				s.t.Fatalf("rank %d learned\n%s\nbut the coordinator sent\n%s", r, a, b)
			}
			for _, name := range rs[i].Names {
				sr.done[name]++
			}
		}
	}
	sr.inbox = sr.inbox[k:]
}

func (s *sim) run() {
	for steps := 0; ; steps++ {
		if steps > 1_000_000 {
			s.t.Fatal("simulation does not finish")
		}
		s.now = s.now.Add(time.Millisecond)
		var can []int
		for r := range s.ranks {
			if s.runnable(r) > 0 {
				can = append(can, r)
			}
		}
		pendingInbox := slices.ContainsFunc(s.ranks, func(sr *simRank) bool { return len(sr.inbox) > 0 })
		if len(can) == 0 && !pendingInbox {
			s.ready()
			if slices.ContainsFunc(s.ranks, func(sr *simRank) bool { return len(sr.inbox) > 0 }) {
				continue
			}
			break
		}
		if s.toggles && s.rng.IntN(15) == 0 {
			off := !s.co.cache.off
			s.cacheOff[len(s.log)] = off
			s.log = append(s.log, []byte{})
			s.co.SetCacheOff(off)
			continue
		}
		switch a := s.rng.IntN(10); {
		case a < 6 && len(can) > 0:
			r := can[s.rng.IntN(len(can))]
			k := 1
			if !s.oneByOne {
				k = 1 + s.rng.IntN(s.runnable(r))
			}
			s.submit(r, k)
		case a < 8:
			s.ready()
		default:
			var has []int
			for r, sr := range s.ranks {
				if len(sr.inbox) > 0 {
					has = append(has, r)
				}
			}
			if len(has) == 0 {
				continue
			}
			r := has[s.rng.IntN(len(has))]
			s.deliver(r, 1+s.rng.IntN(len(s.ranks[r].inbox)))
		}
	}
	for _, o := range s.ops {
		if s.occur[o.name] != s.steps {
			s.t.Fatalf("%q came out %d times in %d steps", o.name, s.occur[o.name], s.steps)
		}
	}
	if n := s.co.Pending(); n != 0 {
		s.t.Fatalf("%d ops still pending", n)
	}
	want := s.co.cache.table()
	for r, sr := range s.ranks {
		if err := cacheAgrees(sr.cache, want); err != nil {
			s.t.Fatalf("rank %d at the end: %v", r, err)
		}
	}
}

// TestRandomOrders runs random training loops: random ops, every rank submitting each step's ops
// in its own random order, responses reaching ranks after random delays, small caches that evict,
// and in a third of them the cache turned off and on again at random points (the autotuner's).
// Every op must come out exactly once per step, error-free, as submitted, fused by the rules; every
// rank must learn the same stream; the cache must change nothing but the bytes sent (checked
// against a coordinator with no cache fed the same events); and replaying the events must give the
// same bytes.
func TestRandomOrders(t *testing.T) {
	n := 400
	if testing.Short() {
		n = 60
	}
	compact := 0
	for seed := range uint64(n) {
		s := newSim(t, seed)
		t.Run(fmt.Sprintf("seed%d", seed), func(t *testing.T) {
			s.t = t
			s.run()
			compact += s.compact
			if s.oneByOne {
				if len(s.refOut) != len(s.out) {
					t.Fatalf("%d responses with the cache, %d without", len(s.out), len(s.refOut))
				}
				for i := range s.out {
					a, b := s.out[i], s.refOut[i]
					a.CacheIDs, a.Evict, a.FromCache = nil, nil, false
					if fa, fb := formatResponse(&a), formatResponse(&b); fa != fb {
						t.Fatalf("response %d with the cache:\n%s\nwithout:\n%s", i, fa, fb)
					}
				}
			}
			replay(t, s)
		})
	}
	if compact == 0 {
		t.Error("no request was ever sent as a cache id")
	}
}

// replay feeds the logged events to a fresh Coordinator and expects the same response bytes.
func replay(t *testing.T, s *sim) {
	co, err := NewCoordinator(s.cfg)
	if err != nil {
		t.Fatal(err)
	}
	var got []Response
	now := epoch
	for i, msg := range s.log {
		if msg == nil {
			got = append(got, co.Ready()...)
			continue
		}
		if off, ok := s.cacheOff[i]; ok {
			co.SetCacheOff(off)
			continue
		}
		b, err := DecodeBatch(msg)
		if err != nil {
			t.Fatal(err)
		}
		if err := co.SubmitBatch(now, b); err != nil {
			t.Fatal(err)
		}
	}
	got = append(got, co.Ready()...)
	if !bytes.Equal(EncodeResponses(nil, got), EncodeResponses(nil, s.out)) {
		t.Fatal("replaying the same events gave different responses")
	}
}
