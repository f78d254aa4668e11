package kolo

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/dtype"
	"github.com/kolo-dl/kolo/internal/engine/negotiate"
	"github.com/kolo-dl/kolo/internal/jobenv"
)

// Unnamed ops are named by call order, whatever their shape or dtype: ranks that pass different
// shapes to the same call then meet under one name and get a mismatch error, instead of waiting for
// each other under names derived from their own shapes.
func TestNamer(t *testing.T) {
	var joins uint64
	n := newNamer(func() uint64 { return joins }, nil)
	cases := []struct {
		set   int
		kind  negotiate.OpKind
		user  string
		joins uint64
		want  string
	}{
		{0, negotiate.Allreduce, "", 0, "noname.0"},
		{0, negotiate.Allgather, "", 0, "noname.1"}, // one count for every kind
		{0, negotiate.Allreduce, "w", 0, "allreduce.w"},
		{0, negotiate.Broadcast, "w", 0, "broadcast.w"}, // scoped by kind, as Horovod's names
		{0, negotiate.Barrier, "", 0, "noname.2"},
		{3, negotiate.Allreduce, "", 0, "noname.0"}, // each process set counts its own
		{0, negotiate.Join, "", 0, "join"},
		{0, negotiate.Allreduce, "", 0, "noname.3"}, // join used up no number
		{0, negotiate.Allreduce, "", 1, "noname.0"}, // a completed join restarts the global count
		{3, negotiate.Allreduce, "", 1, "noname.1"}, // and no other
		{0, negotiate.Allreduce, "", 1, "noname.1"},
	}
	for i, c := range cases {
		joins = c.joins
		if got := n.name(c.set, c.kind, c.user); got != c.want {
			t.Errorf("call %d (%v %q in set %d, joins %d): %q, want %q", i, c.kind, c.user, c.set, c.joins, got, c.want)
		}
	}
	// After crossed calls failed, the count moves up to the coordinator's number (never down), in
	// the set it came for; in the global set only until the next join.
	floor := map[int][2]uint64{0: {10, 1}, 3: {2, 0}}
	n2 := newNamer(func() uint64 { return joins }, func(set int) (uint64, uint64) { return floor[set][0], floor[set][1] })
	joins = 1
	for i, want := range []string{"noname.10", "noname.11"} {
		if got := n2.name(0, negotiate.Allreduce, ""); got != want {
			t.Errorf("after a resync, call %d: %q, want %q", i, got, want)
		}
	}
	if got := n2.name(3, negotiate.Allreduce, ""); got != "noname.2" {
		t.Errorf("set 3 after its resync: %q", got)
	}
	joins = 2
	if got := n2.name(0, negotiate.Allreduce, ""); got != "noname.0" {
		t.Errorf("after a join that followed the resync: %q", got)
	}
	joins = 1 // back to n's
	if got := n.group(0, negotiate.Allreduce, "g", 2); strings.Join(got, " ") != "allreduce.g.0 allreduce.g.1" {
		t.Errorf("named group: %q", got)
	}
	if got := n.group(0, negotiate.Allgather, "", 2); strings.Join(got, " ") != "noname.2.0 noname.2.1" {
		t.Errorf("unnamed group: %q", got)
	}
}

func initSingle(t *testing.T) {
	t.Helper()
	if err := Init(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := Shutdown(); err != nil {
			t.Error(err)
		}
	})
}

func wait(t *testing.T, hs ...*Handle) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i, h := range hs {
		if err := h.Wait(ctx); err != nil {
			t.Fatalf("op %d: %v", i, err)
		}
	}
}

func TestGroups(t *testing.T) {
	initSingle(t)
	a, b := []float32{1, 2, 3}, []int64{4, 5}
	outA, outB := make([]float32, 3), make([]int64, 2)
	hs := AllreduceGroupAsync("g", []Tensor{Of(a), Of(b)}, []Tensor{Of(outA), Of(outB)}, Sum, Postscale(2))
	wait(t, hs...)
	if outA[2] != 6 || outB[1] != 10 {
		t.Errorf("grouped allreduce ×2 of %v, %v gave %v, %v", a, b, outA, outB)
	}
	hs = AllgatherGroupAsync("", []Tensor{Of(a, 3, 1), Of(b)})
	wait(t, hs...)
	if got := As[float32](hs[0].Tensor()); len(got) != 3 || got[1] != 2 || hs[0].Tensor().Shape[1] != 1 {
		t.Errorf("grouped allgather: %v %v", got, hs[0].Tensor().Shape)
	}
	hs = ReduceScatterGroupAsync("rs", []Tensor{Of(a)}, Average)
	wait(t, hs...)
	if got := As[float32](hs[0].Tensor()); len(got) != 3 || got[0] != 1 {
		t.Errorf("grouped reducescatter: %v", got)
	}

	// One malformed member fails every member before any reaches the engine: the others would
	// otherwise wait for it on every rank.
	bad := Tensor{Data: make([]byte, 3), DType: dtype.Float32, Shape: []int64{1}}
	hs = AllreduceGroupAsync("bad", []Tensor{Of(a), bad}, nil, Sum)
	for i, h := range hs {
		if err := h.Wait(context.Background()); err == nil || !strings.Contains(err.Error(), "tensor 1") {
			t.Errorf("member %d of a group with a malformed tensor: err = %v", i, err)
		}
	}
}

func TestGroupIDsAgreeAcrossRanks(t *testing.T) {
	// Two "ranks" (fresh namers) submitting the same unnamed group derive the same names, and so
	// the same group id; a different group gets another id.
	ids := func(s *state, shapes ...[]int64) (names []string, group int64) {
		ins := make([]Tensor, len(shapes))
		for i, sh := range shapes {
			ins[i] = Tensor{Data: make([]byte, 4*elemCount(sh)), DType: dtype.Float32, Shape: sh}
		}
		reqs := s.groupRequests(negotiate.Allreduce, "", ins, nil)
		for _, req := range reqs {
			names = append(names, req.Name)
			if req.Group != reqs[0].Group || req.GroupSize != len(reqs) {
				t.Fatalf("members disagree: %+v", req)
			}
		}
		return names, reqs[0].Group
	}
	r0, r1 := &state{names: newNamer(nil, nil)}, &state{names: newNamer(nil, nil)}
	n0, g0 := ids(r0, []int64{2}, []int64{3})
	n1, g1 := ids(r1, []int64{2}, []int64{3})
	if g0 != g1 || strings.Join(n0, ",") != strings.Join(n1, ",") || g0 == 0 {
		t.Errorf("ranks disagree: %v %d vs %v %d", n0, g0, n1, g1)
	}
	if _, g2 := ids(r0, []int64{2}, []int64{3}); g2 == g0 {
		t.Errorf("the next group got the same id %d", g2)
	}
}

func elemCount(shape []int64) int64 {
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	return n
}

func TestInitRefusesAnotherLauncherVersion(t *testing.T) {
	t.Setenv(jobenv.LauncherVersion, "0.0.1-other")
	err := Init()
	if err == nil {
		Shutdown()
		t.Fatal("Init accepted a launcher of another version")
	}
	for _, want := range []string{Version, "0.0.1-other", "kolo run"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	t.Setenv(jobenv.LauncherVersion, Version)
	initSingle(t)
	if !IsHomogeneous() || Size() != 1 {
		t.Errorf("single process: homogeneous %v size %d", IsHomogeneous(), Size())
	}
}

// The per-op cost of the API and engine without any peer (what every op pays on top of the
// network); the C ABI adds a few hundred nanoseconds per call.
func BenchmarkAllreduceSingleRank(b *testing.B) {
	if err := Init(); err != nil {
		b.Fatal(err)
	}
	defer Shutdown()
	x := []float32{1}
	t := Of(x)
	ctx := context.Background()
	for b.Loop() {
		if err := AllreduceAsync("lat", t, t, Sum).Wait(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
