package negotiate

import (
	"strings"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/dtype"
)

func TestFormatRanks(t *testing.T) {
	for _, c := range []struct {
		in   []int
		want string
	}{
		{nil, ""},
		{[]int{3}, "3"},
		{[]int{0, 1}, "0,1"},
		{[]int{0, 1, 2}, "0-2"},
		{[]int{0, 2, 3, 4, 7, 8, 10}, "0,2-4,7,8,10"},
		{[]int{5, 6, 7, 8, 9, 10, 11}, "5-11"},
	} {
		if got := formatRanks(c.in); got != c.want {
			t.Errorf("formatRanks(%v) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestOpKindNames(t *testing.T) {
	for k := Allreduce; k <= Join; k++ {
		got, err := ParseOpKind(k.String())
		if err != nil || got != k {
			t.Errorf("ParseOpKind(%q) = %v, %v", k.String(), got, err)
		}
	}
	if _, err := ParseOpKind("allreduce2"); err == nil {
		t.Error("ParseOpKind accepted a bad name")
	}
	if InvalidOp.String() != "op(0)" || OpKind(99).String() != "op(99)" {
		t.Errorf("invalid kinds print as %q, %q", InvalidOp, OpKind(99))
	}
	for _, c := range []struct {
		op   uint8
		avg  bool
		want string
	}{{ReduceSum, false, "sum"}, {ReduceSum, true, "average"}, {ReduceMin, false, "min"}, {ReduceMax, true, "max+average"},
		{ReduceProd, false, "prod"}, {9, false, "reduceop(9)"}} {
		if got := ReduceOpName(c.op, c.avg); got != c.want {
			t.Errorf("ReduceOpName(%d, %v) = %q, want %q", c.op, c.avg, got, c.want)
		}
	}
}

func TestContractErrors(t *testing.T) {
	if _, err := NewCoordinator(Config{}); err == nil {
		t.Error("a coordinator for 0 ranks")
	}
	if _, err := NewCache(2, 2, 0); err == nil {
		t.Error("a cache for rank 2 of 2")
	}
	co, _ := NewCoordinator(Config{Size: 2})
	if err := co.Submit(epoch, 2, Request{Name: "x"}); err == nil || !strings.Contains(err.Error(), "rank 2") {
		t.Errorf("submit from rank 2 of 2: %v", err)
	}
	if err := co.Join(epoch, -1); err == nil {
		t.Error("join from rank -1")
	}
	if err := co.SubmitCached(epoch, 0, 5, 0); err == nil || !strings.Contains(err.Error(), "response 5") {
		t.Errorf("a rank claiming responses never sent: %v", err)
	}
}

func TestConfigDefaults(t *testing.T) {
	c := Config{Size: 1, CacheCapacity: 1 << 30}.withDefaults()
	if c.FusionBytes != 128<<20 || c.StallWarning != time.Minute || c.StallShutdown != 0 || c.CacheCapacity != MaxCacheIDs/2 {
		t.Errorf("defaults: %+v", c)
	}
	if c := (Config{Size: 1}).withDefaults(); c.CacheCapacity != 1024 {
		t.Errorf("default cache capacity %d", c.CacheCapacity)
	}
}

// TestLearnRejects: a cache that would drift from the coordinator's says so instead.
func TestLearnRejects(t *testing.T) {
	newCache := func() *Cache {
		c, _ := NewCache(0, 2, 4)
		return c
	}
	ok := Response{Seq: 1, Kind: Allreduce, Names: []string{"a"}, DType: dtype.Float32, ReduceOp: ReduceSum,
		PreScale: 1, PostScale: 1, Shapes: [][]int64{{2}}, CacheIDs: []uint32{0}}
	for name, c := range map[string]struct {
		before []Response
		r      Response
		want   string
	}{
		"gap":           {r: Response{Seq: 2, Kind: Barrier}, want: "lost or reordered"},
		"evict unknown": {r: Response{Seq: 1, Kind: Join, Evict: []uint32{3}}, want: "does not hold"},
		"id too big":    {r: Response{Seq: 1, Kind: Barrier, Names: []string{"b"}, CacheIDs: []uint32{8}}, want: "beyond"},
		"id taken":      {before: []Response{ok}, r: Response{Seq: 2, Kind: Barrier, Names: []string{"b"}, CacheIDs: []uint32{0}}, want: "still stands for"},
		"name has id":   {before: []Response{ok}, r: Response{Seq: 2, Kind: Barrier, Names: []string{"a"}, CacheIDs: []uint32{1}}, want: "still has id"},
		"ids vs names":  {r: Response{Seq: 1, Kind: Barrier, Names: []string{"a", "b"}, CacheIDs: []uint32{1}}, want: "2 names"},
		"no per-rank":   {r: Response{Seq: 1, Kind: Allgather, Names: []string{"g"}, Shapes: [][]int64{{2}}, CacheIDs: []uint32{1}}, want: "per-rank"},
		"cached absent": {r: Response{Seq: 1, FromCache: true, CacheIDs: []uint32{2}}, want: "does not hold"},
		"cached kind":   {before: []Response{ok}, r: Response{Seq: 2, Kind: Barrier, FromCache: true, CacheIDs: []uint32{0}}, want: "says barrier"},
	} {
		cache := newCache()
		for _, b := range c.before {
			if err := cache.Learn(&b); err != nil {
				t.Fatalf("%s: setup: %v", name, err)
			}
		}
		if err := cache.Learn(&c.r); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want it to say %q", name, err, c.want)
		}
	}
}

// TestLookup: a cache hit needs every field the kind uses to match, and only those.
func TestLookup(t *testing.T) {
	c, _ := NewCache(1, 2, 8)
	resps := []Response{
		{Seq: 1, Kind: Allreduce, Names: []string{"a"}, DType: dtype.Float32, ReduceOp: ReduceSum, Average: true,
			PreScale: 1, PostScale: 0.5, Shapes: [][]int64{{2, 3}}, CacheIDs: []uint32{0}},
		{Seq: 2, Kind: Allgather, Names: []string{"g"}, DType: dtype.Int8, Shapes: [][]int64{{5, 2}},
			Dim0: [][]int64{{1, 4}}, CacheIDs: []uint32{1}},
		{Seq: 3, Kind: Alltoall, Names: []string{"t"}, DType: dtype.Int8, Shapes: [][]int64{{6}},
			Splits: [][]int64{{1, 2}, {2, 1}}, CacheIDs: []uint32{2}},
		{Seq: 4, Kind: Alltoall, Names: []string{"e"}, DType: dtype.Int8, Shapes: [][]int64{{8}},
			Splits: [][]int64{{2, 2}, {2, 2}}, CacheIDs: []uint32{3}},
		{Seq: 5, Kind: Barrier, Names: []string{"b"}, CacheIDs: []uint32{4}},
	}
	for i := range resps {
		if err := c.Learn(&resps[i]); err != nil {
			t.Fatal(err)
		}
	}
	a := Request{Name: "a", Kind: Allreduce, DType: dtype.Float32, Shape: []int64{2, 3}, ReduceOp: ReduceSum, Average: true, PostScale: 0.5}
	for _, tc := range []struct {
		name string
		req  Request
		id   uint32
		hit  bool
	}{
		{"exact", a, 0, true},
		{"prescale 0 means 1", func() Request { r := a; r.PreScale = 0; return r }(), 0, true},
		{"unused root ignored", func() Request { r := a; r.Root = 1; return r }(), 0, true},
		{"shape", func() Request { r := a; r.Shape = []int64{3, 2}; return r }(), 0, false},
		{"dtype", func() Request { r := a; r.DType = dtype.Float64; return r }(), 0, false},
		{"average", func() Request { r := a; r.Average = false; return r }(), 0, false},
		{"postscale", func() Request { r := a; r.PostScale = 1; return r }(), 0, false},
		{"group", func() Request { r := a; r.Group, r.GroupSize = 1, 1; return r }(), 0, false},
		{"unknown name", Request{Name: "zz", Kind: Allreduce}, 0, false},
		{"my allgather rows", Request{Name: "g", Kind: Allgather, DType: dtype.Int8, Shape: []int64{4, 2}}, 1, true},
		{"rank 0's rows", Request{Name: "g", Kind: Allgather, DType: dtype.Int8, Shape: []int64{1, 2}}, 1, false},
		{"my splits", Request{Name: "t", Kind: Alltoall, DType: dtype.Int8, Shape: []int64{3}, Splits: []int64{2, 1}}, 2, true},
		{"other splits", Request{Name: "t", Kind: Alltoall, DType: dtype.Int8, Shape: []int64{3}, Splits: []int64{1, 2}}, 2, false},
		{"equal split as nil", Request{Name: "e", Kind: Alltoall, DType: dtype.Int8, Shape: []int64{4}}, 3, true},
		{"equal split written", Request{Name: "e", Kind: Alltoall, DType: dtype.Int8, Shape: []int64{4}, Splits: []int64{2, 2}}, 3, true},
		{"nil split, other rows", Request{Name: "e", Kind: Alltoall, DType: dtype.Int8, Shape: []int64{6}}, 3, false},
		{"barrier ignores data", Request{Name: "b", Kind: Barrier, DType: dtype.Float32, Shape: []int64{9}}, 4, true},
		{"kind", Request{Name: "b", Kind: Allreduce}, 0, false},
	} {
		id, hit := c.Lookup(&tc.req)
		if hit != tc.hit || (hit && id != tc.id) {
			t.Errorf("%s: Lookup = %d, %v; want %d, %v", tc.name, id, hit, tc.id, tc.hit)
		}
	}
}
