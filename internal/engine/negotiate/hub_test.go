package negotiate

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"

	"github.com/kolo-dl/kolo/internal/dtype"
	"strings"
	"testing"
	"time"
)

func TestSetTable(t *testing.T) {
	same := func(n int, c SetChange) []SetChange {
		out := make([]SetChange, n)
		for i := range out {
			out[i] = c
		}
		return out
	}
	add := func(r ...int) SetChange { return SetChange{Ranks: r} }
	rm := func(id int) SetChange { return SetChange{Remove: true, ID: id} }
	tab := NewSetTable(4)
	steps := []struct {
		props   []SetChange
		wantID  int
		wantErr string
	}{
		{same(4, add(0, 1)), 1, ""},
		{same(4, add(1, 2, 3)), 2, ""},
		{same(4, add(0, 1)), 0, "process set 1 already has these ranks"},
		{same(4, add(0, 1, 2, 3)), 0, "all the job's ranks: use the global process set"},
		{same(4, add()), 0, "add process set []: no ranks"},
		{same(4, add(0, 4)), 0, "rank 4 is outside the job's ranks [0,4)"},
		{same(4, add(1, 1)), 0, "rank 1 is listed twice"},
		{same(4, add(2, 1)), 0, "not in ascending order"},
		{[]SetChange{add(0, 1), add(1, 2), add(1, 2), add(0, 1)}, 0,
			"ranks disagree (every rank must make the same call, in the same order): ranks 0,3 sent add process set [0 1]; ranks 1,2 sent add process set [1 2]"},
		{[]SetChange{rm(1), rm(1), add(0, 2), rm(1)}, 0, "ranks 0,1,3 sent remove process set 1; rank 2 sent add process set [0 2]"},
		{same(3, add(0)), 0, "3 proposals for 4 ranks"},
		{same(4, rm(0)), 0, "global process set cannot be removed"},
		{same(4, rm(7)), 0, "remove process set 7: no such process set"},
		{same(4, rm(1)), 1, ""},
		{same(4, rm(1)), 0, "no such process set"},
		// Ids are never reused, so an op that names a removed set cannot land in a new one.
		{same(4, add(0, 1)), 3, ""},
	}
	for i, s := range steps {
		before := tab.IDs()
		got, err := tab.Apply(s.props)
		if s.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), s.wantErr) {
				t.Fatalf("step %d: err %v, want %q", i, err, s.wantErr)
			}
			if !slices.Equal(tab.IDs(), before) {
				t.Fatalf("step %d: a failed change changed the table: %v -> %v", i, before, tab.IDs())
			}
			continue
		}
		if err != nil || got.ID != s.wantID {
			t.Fatalf("step %d: got %+v, %v; want id %d", i, got, err, s.wantID)
		}
	}
	if got := tab.IDs(); !slices.Equal(got, []int{0, 2, 3}) {
		t.Errorf("ids %v, want [0 2 3]", got)
	}
	if r, _ := tab.Ranks(2); !slices.Equal(r, []int{1, 2, 3}) {
		t.Errorf("set 2 has ranks %v", r)
	}
}

func TestSetChangeRoundTrip(t *testing.T) {
	for _, c := range []SetChange{{Ranks: []int{0, 3, 9}}, {Ranks: []int{}}, {Remove: true, ID: 12}} {
		got, err := DecodeSetChange(EncodeSetChange(nil, c))
		if err != nil || !reflect.DeepEqual(got, c) {
			t.Errorf("%+v came back as %+v, %v", c, got, err)
		}
	}
}

func FuzzDecodeSetChange(f *testing.F) {
	f.Add(EncodeSetChange(nil, SetChange{Ranks: []int{0, 1}}))
	f.Add(EncodeSetChange(nil, SetChange{Remove: true, ID: 3}))
	f.Fuzz(func(t *testing.T, p []byte) {
		c, err := DecodeSetChange(p)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error does not wrap ErrMalformed: %v", err)
			}
			return
		}
		c2, err := DecodeSetChange(EncodeSetChange(nil, c))
		if err != nil || c2.String() != c.String() {
			t.Fatalf("round trip: %+v -> %+v, %v", c, c2, err)
		}
		_, _ = NewSetTable(3).Apply([]SetChange{c, c, c})
	})
}

func TestSetWireRoundTrip(t *testing.T) {
	b := &Batch{Rank: 1, Seen: 4, Set: 7, Cached: []uint32{2}, Requests: []Request{{Name: "x", Kind: Barrier}}}
	got, err := DecodeBatch(EncodeBatch(nil, b))
	if err != nil || !reflect.DeepEqual(got, b) {
		t.Fatalf("batch %+v came back as %+v, %v", b, got, err)
	}
	rs := sampleResponses()
	for _, set := range []int{0, 5} {
		msg := EncodeSetResponses(nil, set, rs)
		gotSet, got, err := DecodeSetResponses(msg)
		if err != nil || gotSet != set || len(got) != len(rs) {
			t.Fatalf("set %d: got set %d, %d responses, %v", set, gotSet, len(got), err)
		}
		_, err = DecodeResponses(msg)
		if (err != nil) != (set != 0) {
			t.Errorf("set %d: DecodeResponses: %v", set, err)
		}
	}
	if !bytes.Equal(EncodeSetResponses(nil, 0, rs), EncodeResponses(nil, rs)) {
		t.Error("the global set's responses are not plain MsgResponses")
	}
}

func FuzzDecodeSetResponses(f *testing.F) {
	f.Add(EncodeSetResponses(nil, 3, sampleResponses()))
	f.Fuzz(func(t *testing.T, p []byte) {
		set, rs, err := DecodeSetResponses(p)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error does not wrap ErrMalformed: %v", err)
			}
			return
		}
		q := EncodeSetResponses(nil, set, rs)
		set2, rs2, err := DecodeSetResponses(q)
		if err != nil || set2 != set || !bytes.Equal(EncodeSetResponses(nil, set2, rs2), q) {
			t.Fatalf("re-encoding set %d is not stable: %v", set, err)
		}
	})
}

func TestHubProtocolErrors(t *testing.T) {
	h, err := NewHub(Config{Size: 3})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.AddSet(1, []int{0, 2}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		from int
		b    Batch
		want string
	}{
		{1, Batch{Set: 1}, "not in"},
		{2, Batch{Set: 1, Rank: 0}, "claims set rank 0, want 1"},
		{0, Batch{Set: 9}, "does not exist"},
	} {
		if err := h.SubmitBatch(epoch, tc.from, &tc.b); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("batch %+v from %d: %v, want %q", tc.b, tc.from, err, tc.want)
		}
	}
	for _, tc := range []struct {
		id    int
		ranks []int
		want  string
	}{
		{1, []int{1}, "taken"},
		{0, []int{1}, "taken"},
		{2, []int{1, 3}, "outside"},
		{2, nil, "no ranks"},
	} {
		if err := h.AddSet(tc.id, tc.ranks); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("AddSet(%d, %v): %v, want %q", tc.id, tc.ranks, err, tc.want)
		}
	}
	if err := h.RemoveSet(0); err == nil {
		t.Error("removed the global set")
	}
	if err := h.RemoveSet(1); err != nil || h.Coordinator(1) != nil || h.RemoveSet(1) == nil {
		t.Errorf("remove set 1: %v", err)
	}
}

// simSet is one process set of the simulation below: its ops, and per member its cache, its
// submissions still to make and what it has learned.
type simSet struct {
	id      int
	ranks   []int // job ranks
	ops     []*opTmpl
	byName  map[string]*opTmpl
	caches  []*Cache
	todo    [][][2]int // per set rank: (step, op)
	done    []map[string]int
	out     []Response
	refOut  []Response
	ref     *Coordinator // a standalone Coordinator fed only this set's batches
	occur   map[string]int
	pending int // ops not yet out, over all steps
}

// TestHubSetsIndependent runs random training loops in random overlapping process sets (the
// global one included) that reuse each other's tensor names, through the Hub and the wire codec.
// One rank stays idle for the first phase: every set without it must finish regardless. Each set's
// stream must equal what a Coordinator of its own would emit for its batches alone (other sets'
// traffic changes nothing), reach exactly its members, and leave every member's cache equal to the
// coordinator's.
func TestHubSetsIndependent(t *testing.T) {
	n := 200
	if testing.Short() {
		n = 40
	}
	for seed := range uint64(n) {
		t.Run(fmt.Sprintf("seed%d", seed), func(t *testing.T) { runHubSim(t, seed) })
	}
}

func runHubSim(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, seed*31+7))
	size := 3 + rng.IntN(4)
	const steps = 2
	cfg := Config{Size: size, FusionBytes: []int64{64, 0}[rng.IntN(2)], CacheCapacity: []int{-1, 2, 0}[rng.IntN(3)], StallWarning: -1}
	hub, err := NewHub(cfg)
	if err != nil {
		t.Fatal(err)
	}
	lazy := rng.IntN(size)
	all := make([]int, size)
	for i := range all {
		all[i] = i
	}
	memberLists := [][]int{all}
	for range 1 + rng.IntN(4) {
		m := rng.Perm(size)[:1+rng.IntN(size-1)]
		slices.Sort(m)
		memberLists = append(memberLists, m)
	}
	var sets []*simSet
	for i, members := range memberLists {
		if i > 0 {
			if err := hub.AddSet(i, members); err != nil {
				t.Fatal(err)
			}
		}
		s := &simSet{id: i, ranks: members, byName: map[string]*opTmpl{}, occur: map[string]int{}}
		s.ops = randomOps(rng, len(members), steps)
		for k, o := range s.ops {
			o.name = fmt.Sprintf("op%d", k) // the same names in every set
			s.byName[o.name] = o
		}
		s.pending = len(s.ops) * steps
		rcfg := cfg
		rcfg.Size, rcfg.Ranks = len(members), members
		if s.ref, err = NewCoordinator(rcfg); err != nil {
			t.Fatal(err)
		}
		for r := range members {
			c, err := NewCache(r, len(members), cfg.CacheCapacity)
			if err != nil {
				t.Fatal(err)
			}
			s.caches = append(s.caches, c)
			s.done = append(s.done, map[string]int{})
			var todo [][2]int
			for step := range steps {
				for _, k := range rng.Perm(len(s.ops)) {
					todo = append(todo, [2]int{step, k})
				}
			}
			s.todo = append(s.todo, todo)
		}
		sets = append(sets, s)
	}
	inbox := make([][][]byte, size) // per job rank
	now := epoch
	runnable := func(s *simSet, r int) int {
		n := 0
		for _, it := range s.todo[r] {
			if s.done[r][s.ops[it[1]].name] < it[0] {
				break
			}
			n++
		}
		return n
	}
	submit := func(s *simSet, r int) {
		k := 1 + rng.IntN(runnable(s, r))
		var reqs []Request
		for _, it := range s.todo[r][:k] {
			reqs = append(reqs, s.ops[it[1]].request(it[0], r))
		}
		s.todo[r] = s.todo[r][k:]
		b := &Batch{Set: s.id}
		s.caches[r].Compact(b, reqs...)
		got, err := DecodeBatch(EncodeBatch(nil, b))
		if err != nil {
			t.Fatal(err)
		}
		if err := hub.SubmitBatch(now, s.ranks[r], got); err != nil {
			t.Fatal(err)
		}
		ref := *got
		if err := s.ref.SubmitBatch(now, &ref); err != nil {
			t.Fatal(err)
		}
	}
	ready := func() {
		for _, sr := range hub.Ready() {
			s := sets[sr.Set]
			if !slices.Equal(sr.Members, s.ranks) {
				t.Fatalf("set %d: responses for %v, members %v", sr.Set, sr.Members, s.ranks)
			}
			for _, r := range sr.Responses {
				if r.Error != "" {
					t.Fatalf("set %d: error response: %s", s.id, r.Error)
				}
				for _, name := range r.Names {
					s.occur[name]++
					s.pending--
				}
			}
			s.out = append(s.out, sr.Responses...)
			msg := EncodeSetResponses(nil, sr.Set, sr.Responses)
			for _, m := range sr.Members {
				inbox[m] = append(inbox[m], msg)
			}
		}
		for _, s := range sets {
			s.refOut = append(s.refOut, s.ref.Ready()...)
		}
	}
	deliver := func(m int) {
		msg := inbox[m][0]
		inbox[m] = inbox[m][1:]
		id, rs, err := DecodeSetResponses(msg)
		if err != nil {
			t.Fatal(err)
		}
		s := sets[id]
		r, ok := slices.BinarySearch(s.ranks, m)
		if !ok {
			t.Fatalf("rank %d got responses of set %d, which it is not in", m, id)
		}
		for i := range rs {
			if err := s.caches[r].Learn(&rs[i]); err != nil {
				t.Fatalf("set %d rank %d: %v", id, m, err)
			}
			if a, b := formatResponse(&rs[i]), formatResponse(&s.out[rs[i].Seq-1]); a != b {
				t.Fatalf("set %d rank %d learned\n%s\nbut the hub sent\n%s", id, m, a, b)
			}
			for _, name := range rs[i].Names {
				s.done[r][name]++
			}
		}
	}
	play := func(active func(job int) bool) {
		for iter := 0; ; iter++ {
			if iter > 1_000_000 {
				t.Fatal("simulation does not finish")
			}
			now = now.Add(time.Millisecond)
			type move struct{ s, r int }
			var can []move
			for si, s := range sets {
				for r, job := range s.ranks {
					if active(job) && runnable(s, r) > 0 {
						can = append(can, move{si, r})
					}
				}
			}
			var has []int
			for m := range inbox {
				if active(m) && len(inbox[m]) > 0 {
					has = append(has, m)
				}
			}
			if len(can) == 0 && len(has) == 0 {
				ready()
				if slices.ContainsFunc(all, func(m int) bool { return active(m) && len(inbox[m]) > 0 }) {
					continue
				}
				return
			}
			switch a := rng.IntN(10); {
			case a < 5 && len(can) > 0:
				mv := can[rng.IntN(len(can))]
				submit(sets[mv.s], mv.r)
			case a < 7 || len(has) == 0:
				ready()
			default:
				deliver(has[rng.IntN(len(has))])
			}
		}
	}
	play(func(job int) bool { return job != lazy })
	for _, s := range sets {
		if !slices.Contains(s.ranks, lazy) && s.pending != 0 {
			t.Fatalf("set %d %v, without idle rank %d, has %d ops left", s.id, s.ranks, lazy, s.pending)
		}
	}
	play(func(int) bool { return true })
	for _, s := range sets {
		for _, o := range s.ops {
			if s.occur[o.name] != steps {
				t.Fatalf("set %d: %q came out %d times in %d steps", s.id, o.name, s.occur[o.name], steps)
			}
		}
		if !bytes.Equal(EncodeResponses(nil, s.out), EncodeResponses(nil, s.refOut)) {
			t.Fatalf("set %d: the hub's stream differs from a standalone coordinator's", s.id)
		}
		want := hub.Coordinator(s.id).cache.table()
		for r, c := range s.caches {
			if err := cacheAgrees(c, want); err != nil {
				t.Fatalf("set %d rank %d: %v", s.id, s.ranks[r], err)
			}
		}
	}
	if hub.Pending() != 0 {
		t.Fatalf("%d ops pending", hub.Pending())
	}
}

// Ranks that submit one op in different process sets: both sets' ops fail, on the next tick past
// SetMismatchGrace, naming the sets and who used which; an op of one name pending in two
// overlapping sets, as their members submit it in each, is left alone.
func TestHubSetMismatch(t *testing.T) {
	h, err := NewHub(Config{Size: 3})
	if err != nil {
		t.Fatal(err)
	}
	for id, ranks := range map[int][]int{1: {0, 1}, 2: {1, 2}} {
		if err := h.AddSet(id, ranks); err != nil {
			t.Fatal(err)
		}
	}
	req := func(name string) []Request {
		return []Request{{Name: name, Kind: Allreduce, DType: dtype.Float32, Shape: []int64{4}, ReduceOp: ReduceSum}}
	}
	submit := func(from, set, setRank int, name string) {
		t.Helper()
		if err := h.SubmitBatch(epoch, from, &Batch{Set: set, Rank: setRank, Requests: req(name)}); err != nil {
			t.Fatal(err)
		}
	}
	submit(0, 1, 0, "x") // rank 0: "x" in set 1
	submit(1, 0, 1, "x") // rank 1: "x" in the global set
	// Legitimate: "g" in sets 1 and 2, rank 1 (in both) has submitted set 2's only so far.
	submit(0, 1, 0, "g")
	submit(1, 2, 0, "g")
	if out, stalls := h.Tick(epoch.Add(SetMismatchGrace / 2)); len(out) != 0 || len(stalls) != 0 {
		t.Fatalf("before the grace period: %+v %+v", out, stalls)
	}
	out, stalls := h.Tick(epoch.Add(SetMismatchGrace))
	want := `allreduce "x": ranks disagree on its process set: rank 1 submitted it in the global process set, rank 0 in process set 1 (ranks 0,1)`
	var sets []int
	for _, sr := range out {
		for _, r := range sr.Responses {
			if r.Error != want || len(r.Names) != 1 || r.Names[0] != "x" {
				t.Errorf("set %d: %+v, want the error %q", sr.Set, r, want)
			}
		}
		sets = append(sets, sr.Set)
	}
	if !slices.Equal(sets, []int{1, 0}) || len(stalls) != 2 {
		t.Errorf("responses for sets %v, stalls %+v; want errors in sets 1 and 0", sets, stalls)
	}
	// "g" is still pending in both sets, and completes when rank 1 submits set 1's.
	submit(1, 1, 1, "g")
	out = h.Ready()
	if len(out) != 1 || out[0].Set != 1 || out[0].Responses[0].Error != "" {
		t.Errorf("set 1's g: %+v", out)
	}
}

// Grouped calls of different lengths on different ranks (rank 0 groups two tensors, rank 1
// three): every member fails on every rank as soon as both grouped calls are in, the one only
// rank 1 has included, instead of waiting for a rank that never submits it.
func TestGroupsOfDifferentLengths(t *testing.T) {
	c, err := NewCoordinator(Config{Size: 2})
	if err != nil {
		t.Fatal(err)
	}
	group := func(id int64, n int) []Request {
		reqs := make([]Request, n)
		for i := range reqs {
			reqs[i] = Request{Name: fmt.Sprintf("noname.4.%d", i), Kind: Allreduce, DType: dtype.Float32,
				Shape: []int64{4}, ReduceOp: ReduceSum, Group: id, GroupSize: n}
		}
		return reqs
	}
	for _, order := range [][2]int{{0, 1}, {1, 0}} {
		t.Run(fmt.Sprintf("rank %d first", order[0]), func(t *testing.T) {
			calls := map[int][]Request{0: group(12, 2), 1: group(11, 3)}
			for _, r := range order {
				if err := c.SubmitBatch(epoch, &Batch{Rank: r, Requests: calls[r]}); err != nil {
					t.Fatal(err)
				}
			}
			failed := map[string]int{}
			for _, resp := range c.Ready() {
				if resp.Error == "" {
					t.Errorf("a member completed: %+v", resp)
				}
				for _, n := range resp.Names {
					failed[n]++
				}
			}
			for _, n := range []string{"noname.4.0", "noname.4.1", "noname.4.2"} {
				if failed[n] == 0 {
					t.Errorf("%s did not fail (failed: %v)", n, failed)
				}
			}
			if c.Pending() != 0 {
				t.Errorf("%d ops still pending", c.Pending())
			}
		})
	}
}

// Waiting names the job ranks whose submissions rank 0 has not answered: the members that
// submitted a pending op (in job ranks, whatever the set), every member of a group waiting for its
// other members, and ranks that joined; none once everything is answered.
func TestHubWaiting(t *testing.T) {
	req := func(name string, group int64) []Request {
		return []Request{{Name: name, Kind: Allreduce, DType: dtype.Float32, Shape: []int64{4}, ReduceOp: ReduceSum, Group: group, GroupSize: 2}}
	}
	waiting := func(h *Hub) []int {
		w := make([]bool, 4)
		h.Waiting(w)
		var out []int
		for r, ok := range w {
			if ok {
				out = append(out, r)
			}
		}
		return out
	}
	tests := []struct {
		name    string
		batches []Batch // From is Batch.Rank's job rank: set 0 ranks are job ranks, set 1 is {1, 3}
		from    []int
		want    []int
	}{
		{"nothing", nil, nil, nil},
		{"one op, two ranks", []Batch{{Rank: 0, Requests: req("a", 0)}, {Rank: 2, Requests: req("a", 0)}}, []int{0, 2}, []int{0, 2}},
		{"process set ranks are job ranks", []Batch{{Set: 1, Rank: 1, Requests: req("b", 0)}}, []int{3}, []int{3}},
		{"answered", []Batch{{Set: 1, Rank: 0, Requests: req("b", 0)}, {Set: 1, Rank: 1, Requests: req("b", 0)}}, []int{1, 3}, nil},
		{"a group waits for its other member", []Batch{{Set: 1, Rank: 0, Requests: req("g1", 7)}, {Set: 1, Rank: 1, Requests: req("g1", 7)}}, []int{1, 3}, []int{1, 3}},
		{"join", []Batch{{Rank: 1, Join: true}}, []int{1}, []int{1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h, err := NewHub(Config{Size: 4})
			if err != nil {
				t.Fatal(err)
			}
			if err := h.AddSet(1, []int{1, 3}); err != nil {
				t.Fatal(err)
			}
			for i := range tc.batches {
				if err := h.SubmitBatch(epoch, tc.from[i], &tc.batches[i]); err != nil {
					t.Fatal(err)
				}
			}
			h.Ready()
			if got := waiting(h); !slices.Equal(got, tc.want) {
				t.Errorf("waiting %v, want %v", got, tc.want)
			}
		})
	}
}

// A rank that reaches the global set's shutdown has ended in every set: an op of a process set
// it belongs to fails at once, naming it by its job rank, and a set without it goes on.
func TestHubEndsARankInEverySet(t *testing.T) {
	hub, err := NewHub(Config{Size: 3})
	if err != nil {
		t.Fatal(err)
	}
	if err := hub.AddSet(1, []int{1, 2}); err != nil {
		t.Fatal(err)
	}
	if err := hub.AddSet(2, []int{0, 1}); err != nil {
		t.Fatal(err)
	}
	now := time.Unix(0, 0)
	submit := func(set, from, setRank int, name string, kind OpKind) {
		t.Helper()
		b := &Batch{Rank: setRank, Set: set, Requests: []Request{{Name: name, Kind: kind, DType: dtype.Float32, Shape: []int64{1}}}}
		if err := hub.SubmitBatch(now, from, b); err != nil {
			t.Fatal(err)
		}
	}
	submit(1, 1, 0, "in.set1", Allreduce)
	submit(2, 0, 0, "in.set2", Allreduce)
	submit(0, 2, 2, ShutdownName, Barrier)
	var got []string
	for _, sr := range hub.Ready() {
		for _, r := range sr.Responses {
			got = append(got, fmt.Sprintf("set %d: %v %s", sr.Set, r.Names, r.Error))
		}
	}
	want := []string{`set 1: [in.set1] allreduce "in.set1": rank 2 ended without submitting it (reached shutdown: its program finished or called shutdown)`}
	if !slices.Equal(got, want) {
		t.Errorf("responses:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
