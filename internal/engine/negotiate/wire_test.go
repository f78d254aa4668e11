package negotiate

import (
	"bytes"
	"errors"
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/dtype"
)

func sampleBatches() []*Batch {
	return []*Batch{
		{},
		{Rank: 3, Seen: 99, Join: true},
		{Rank: 1, Seen: 7, Requests: []Request{
			{Name: "grad.w1", Kind: Allreduce, DType: dtype.Float32, Shape: []int64{4, 5}, ReduceOp: ReduceSum, Average: true, PostScale: 0.25},
			{Name: "emb", Kind: Allgather, DType: dtype.BFloat16, Shape: []int64{0, 3}, GPU: true},
			{Name: "init", Kind: Broadcast, DType: dtype.Int64, Shape: []int64{9}, Root: 2},
			{Name: "a2a", Kind: Alltoall, DType: dtype.Uint8, Shape: []int64{6}, Splits: []int64{1, 2, 3}},
			{Name: "a2a.empty", Kind: Alltoall, DType: dtype.Uint8, Shape: []int64{0}, Splits: []int64{}},
			{Name: "rs", Kind: ReduceScatter, DType: dtype.Float64, Shape: []int64{8}, ReduceOp: ReduceMax, PreScale: -2},
			{Name: "b", Kind: Barrier, Group: -5, GroupSize: 2},
			{Name: "scalar", Kind: Allreduce, DType: dtype.Int8, ReduceOp: ReduceProd},
			{Name: "refused", Kind: Alltoall, Error: "splits must be int32"},
		}, Cached: []uint32{0, 1, 2, 5, 8, 13, 21, 200}},
		{Rank: 2, Cached: []uint32{5, 3, 3, 1000}},             // unsorted, with a duplicate: list
		{Rank: 2, Cached: []uint32{0, 1, 2, 3, 4, 5, 6, 7, 8}}, // dense: bitset
		{Rank: 0, Cached: []uint32{MaxCacheIDs - 1}},
	}
}

func sampleResponses() []Response {
	return []Response{
		{Seq: 1, Kind: Allreduce, Names: []string{"a", "b"}, DType: dtype.Float32, ReduceOp: ReduceSum, Average: true,
			PreScale: 1, PostScale: 0.5, Shapes: [][]int64{{4, 5}, nil}, CacheIDs: []uint32{0, NoCacheID}, Evict: []uint32{7}},
		{Seq: 2, Kind: Allgather, Names: []string{"g"}, DType: dtype.Float16, GPU: true, Shapes: [][]int64{{6, 2}},
			Dim0: [][]int64{{1, 2, 3}}, Joined: []int{1}, Group: 4, GroupSize: 1},
		{Seq: 3, Kind: Alltoall, Names: []string{"t"}, DType: dtype.Int32, Shapes: [][]int64{{3}},
			Splits: [][]int64{{1, 0}, {1, 1}}},
		{Seq: 4, Kind: Broadcast, Names: []string{"w"}, DType: dtype.Int64, Root: 1, Shapes: [][]int64{{2}}},
		{Seq: 5, Kind: Allreduce, Names: []string{"x"}, Error: `allreduce "x": mismatched shapes`},
		{Seq: 6, Error: "rank 1 sent cache id 9", CacheIDs: []uint32{9}},
		{Seq: 7, Kind: Join, LastJoined: 3},
		{Seq: 8, Kind: Allreduce, FromCache: true, CacheIDs: []uint32{0, 3}},
		{Seq: 9, Kind: Barrier, Names: []string{"sync"}, Shapes: [][]int64{nil}},
		{Seq: 10, Kind: Retune, Tune: Collectives{SmallAllreduceBytes: 32 << 10, SharedRoundBytes: 4 << 20, Hierarchical: true}},
		{Seq: 11, Kind: Retune},
		{Seq: 12, Kind: Allreduce, Names: []string{"e"}, Error: `allreduce "e": ranks 2, 5 ended without submitting it`, Ended: []int{2, 5}},
		{Seq: 13, Kind: Broadcast, Names: []string{"b"}, Error: `broadcast "b": mismatched roots`, Cause: Mismatch},
	}
}

func TestBatchRoundTrip(t *testing.T) {
	for i, b := range sampleBatches() {
		msg := EncodeBatch(nil, b)
		got, err := DecodeBatch(msg)
		if err != nil {
			t.Fatalf("batch %d: %v", i, err)
		}
		want := *b
		if want.Cached != nil {
			want.Cached = sortedCopy(want.Cached)
		}
		for j := range want.Requests {
			if len(want.Requests[j].Shape) == 0 {
				want.Requests[j].Shape = nil
			}
		}
		if want.Requests == nil {
			want.Requests = nil
		}
		if !reflect.DeepEqual(*got, want) {
			t.Errorf("batch %d:\n got %+v\nwant %+v", i, *got, want)
		}
	}
}

func sortedCopy(v []uint32) []uint32 {
	out := append([]uint32(nil), v...)
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && out[j] < out[j-1]; j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

func TestResponsesRoundTrip(t *testing.T) {
	rs := sampleResponses()
	got, err := DecodeResponses(EncodeResponses(nil, rs))
	if err != nil {
		t.Fatal(err)
	}
	want := sampleResponses()
	want[8].Shapes = [][]int64{nil}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}
	// A FromCache response travels as ids only: the rest is the receiver's cache's business.
	full := Response{Seq: 1, Kind: Allreduce, FromCache: true, Names: []string{"a"}, Shapes: [][]int64{{1}}, CacheIDs: []uint32{4}}
	got, err = DecodeResponses(EncodeResponses(nil, []Response{full}))
	if err != nil || got[0].Names != nil || !reflect.DeepEqual(got[0].CacheIDs, []uint32{4}) {
		t.Errorf("cached response came back as %+v, %v", got, err)
	}
}

func TestAbortRoundTrip(t *testing.T) {
	for _, a := range []Abort{
		{Rank: 5, Reason: "rank 5 lost during recv: connection reset"},
		{Rank: 2, Reason: "rank 2: allreduce \"w\": rank 0 made no progress for 1m0s", Stalled: true, StalledOn: 0},
		{Rank: 0, Reason: "", Stalled: true, StalledOn: 7},
	} {
		msg := EncodeAbort(nil, a)
		if k, err := PeekKind(msg); err != nil || k != MsgAbort {
			t.Fatalf("PeekKind = %v, %v", k, err)
		}
		got, err := DecodeAbort(msg)
		if err != nil || got != a {
			t.Errorf("%+v: got %+v, %v", a, got, err)
		}
	}
}

func TestKeepAliveRoundTrip(t *testing.T) {
	msg := EncodeKeepAlive([]byte("x")[:0])
	if k, err := PeekKind(msg); err != nil || k != MsgKeepAlive {
		t.Fatalf("PeekKind = %v, %v", k, err)
	}
	if err := DecodeKeepAlive(msg); err != nil {
		t.Errorf("DecodeKeepAlive: %v", err)
	}
	if len(msg) != 2 {
		t.Errorf("a keep-alive takes %d bytes, want 2", len(msg))
	}
	for name, p := range map[string][]byte{
		"empty":      nil,
		"wrong kind": EncodeAbort(nil, Abort{}),
		"trailing":   append(EncodeKeepAlive(nil), 0),
		"old":        {0, byte(MsgKeepAlive)},
	} {
		if err := DecodeKeepAlive(p); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: err = %v, want ErrMalformed", name, err)
		}
	}
}

// TestCachedBatchIsSmall: the steady state of a 200-tensor model costs a few dozen bytes.
func TestCachedBatchIsSmall(t *testing.T) {
	b := &Batch{Rank: 7, Seen: 12345}
	for i := range 200 {
		b.Cached = append(b.Cached, uint32(i))
	}
	if n := len(EncodeBatch(nil, b)); n > 40 {
		t.Errorf("200 cached ids take %d bytes", n)
	}
	r := Response{Seq: 99999, Kind: Allreduce, FromCache: true, CacheIDs: b.Cached}
	if n := len(EncodeResponses(nil, []Response{r})); n > 420 {
		t.Errorf("a cached response of 200 tensors takes %d bytes", n)
	}
}

func TestDecodeRejects(t *testing.T) {
	good := EncodeBatch(nil, sampleBatches()[2])
	cases := map[string][]byte{
		"empty":         nil,
		"one byte":      {WireVersion},
		"old version":   {0, byte(MsgBatch)},
		"wrong kind":    EncodeAbort(nil, Abort{}),
		"truncated":     good[:len(good)-1],
		"trailing":      append(append([]byte{}, good...), 0),
		"huge count":    {WireVersion, byte(MsgBatch), 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x0f},
		"rank too big":  {WireVersion, byte(MsgBatch), 0xff, 0xff, 0xff, 0xff, 0x0f, 0, 0, 0, 0},
		"unknown flags": {WireVersion, byte(MsgBatch), 0, 0, 0x80, 0, 0},
		"bad mode":      {WireVersion, byte(MsgBatch), 0, 0, 0, 0, 9},
		"id too big":    {WireVersion, byte(MsgBatch), 0, 0, 0, 0, cachedList, 1, 0x80, 0x80, 0x40},
		"bad varint":    {WireVersion, byte(MsgBatch), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
	}
	for name, p := range cases {
		if _, err := DecodeBatch(p); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: err = %v, want ErrMalformed", name, err)
		}
	}
	if _, err := DecodeResponses([]byte{WireVersion, byte(MsgResponses), 1, 1, byte(Allreduce), respFromCache, 0, 0}); !errors.Is(err, ErrMalformed) {
		t.Errorf("a cached response with no ids decoded: %v", err)
	}
	// Retunes: the tune flag (512: varint 0x80 0x04) only with kind Retune and alone, sizes in
	// range, hierarchical 0 or 1.
	for name, p := range map[string][]byte{
		"retune without the flag":  {WireVersion, byte(MsgResponses), 1, 1, byte(Retune), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
		"tune flag on a barrier":   {WireVersion, byte(MsgResponses), 1, 1, byte(Barrier), 0x80, 0x04, 0, 0, 0},
		"tune flag with another":   {WireVersion, byte(MsgResponses), 1, 1, byte(Retune), 0x82, 0x04, 0, 0, 0},
		"negative round":           {WireVersion, byte(MsgResponses), 1, 1, byte(Retune), 0x80, 0x04, 0, 1, 0},
		"hierarchical 2":           {WireVersion, byte(MsgResponses), 1, 1, byte(Retune), 0x80, 0x04, 0, 0, 2},
		"truncated retune":         {WireVersion, byte(MsgResponses), 1, 1, byte(Retune), 0x80, 0x04, 0, 0},
		"settings, hierarchical 7": settingsWithHierarchical(7),
	} {
		var err error
		if name[0] == 's' {
			_, err = DecodeSettings(p)
		} else {
			_, err = DecodeResponses(p)
		}
		if !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: err = %v, want ErrMalformed", name, err)
		}
	}
	if _, err := DecodeAbort([]byte{WireVersion, byte(MsgAbort), 0, 0xff, 0xff, 0x7f}); !errors.Is(err, ErrMalformed) {
		t.Errorf("an abort with a 2 MiB reason decoded: %v", err)
	}
}

func hasNaN(v any) bool {
	switch x := v.(type) {
	case *Batch:
		for _, r := range x.Requests {
			if math.IsNaN(r.PreScale) || math.IsNaN(r.PostScale) {
				return true
			}
		}
	case []Response:
		for _, r := range x {
			if math.IsNaN(r.PreScale) || math.IsNaN(r.PostScale) {
				return true
			}
		}
	}
	return false
}

// FuzzDecodeBatch: no input panics the decoder or the Coordinator it feeds; valid input survives
// encode(decode(x)) unchanged.
func FuzzDecodeBatch(f *testing.F) {
	for _, b := range sampleBatches() {
		f.Add(EncodeBatch(nil, b))
	}
	f.Fuzz(func(t *testing.T, p []byte) {
		b, err := DecodeBatch(p)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error does not wrap ErrMalformed: %v", err)
			}
			return
		}
		q := EncodeBatch(nil, b)
		b2, err := DecodeBatch(q)
		if err != nil {
			t.Fatalf("re-encoded batch does not decode: %v", err)
		}
		if !bytes.Equal(EncodeBatch(nil, b2), q) {
			t.Fatal("encode(decode(x)) is not stable")
		}
		if !hasNaN(b) && !reflect.DeepEqual(b, b2) {
			t.Fatalf("round trip changed the batch:\n%+v\n%+v", b, b2)
		}
		co, _ := NewCoordinator(Config{Size: 4, CacheCapacity: 4, StallShutdown: time.Minute})
		b.Rank %= 4
		b.Seen = 0
		_ = co.SubmitBatch(epoch, b)
		for r := 0; r < 4; r++ {
			_ = co.SubmitBatch(epoch, &Batch{Rank: r, Requests: b.Requests, Cached: b.Cached})
		}
		co.Ready()
		co.Tick(epoch.Add(time.Hour))
	})
}

// FuzzDecodeResponses: no input panics the decoder or a Cache learning from it; valid input
// survives encode(decode(x)) unchanged.
func FuzzDecodeResponses(f *testing.F) {
	f.Add(EncodeResponses(nil, sampleResponses()))
	f.Add(EncodeResponses(nil, sampleResponses()[:1]))
	f.Add(EncodeResponses(nil, sampleResponses()[7:8]))
	f.Fuzz(func(t *testing.T, p []byte) {
		rs, err := DecodeResponses(p)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error does not wrap ErrMalformed: %v", err)
			}
			return
		}
		q := EncodeResponses(nil, rs)
		rs2, err := DecodeResponses(q)
		if err != nil {
			t.Fatalf("re-encoded responses do not decode: %v", err)
		}
		if !bytes.Equal(EncodeResponses(nil, rs2), q) {
			t.Fatal("encode(decode(x)) is not stable")
		}
		if !hasNaN(rs) && !reflect.DeepEqual(rs, rs2) {
			t.Fatalf("round trip changed the responses:\n%+v\n%+v", rs, rs2)
		}
		c, _ := NewCache(1, 3, 4)
		for i := range rs {
			rs[i].Seq = c.Seen() + 1
			if c.Learn(&rs[i]) != nil {
				continue
			}
			for id, s := range c.slots {
				if s != nil {
					req := s.requestFor(c.rank)
					if got, ok := c.Lookup(&req); !ok || got != uint32(id) {
						t.Fatalf("cache id %d: its own request %+v looks up as %d, %v", id, req, got, ok)
					}
				}
			}
		}
	})
}

func FuzzDecodeAbort(f *testing.F) {
	f.Add(EncodeAbort(nil, Abort{Rank: 2, Reason: "oom"}))
	f.Add(EncodeAbort(nil, Abort{Rank: 1, Reason: "stuck", Stalled: true, StalledOn: 3}))
	f.Fuzz(func(t *testing.T, p []byte) {
		a, err := DecodeAbort(p)
		if err != nil {
			return
		}
		if b, err := DecodeAbort(EncodeAbort(nil, a)); err != nil || b != a {
			t.Fatalf("round trip: %+v -> %+v, %v", a, b, err)
		}
	})
}

// settingsWithHierarchical is a Settings message whose hierarchical byte is h: the byte before
// the spin time's (a one-byte varint, 0) and the response cache's.
func settingsWithHierarchical(h byte) []byte {
	p := EncodeSettings(nil, Settings{From: 2})
	p[len(p)-3] = h
	return p
}

func TestSettingsRoundTrip(t *testing.T) {
	for _, s := range []Settings{
		{From: 1, FusionBytes: 128 << 20, CycleTime: 0},
		{From: 240, FusionBytes: 0, CycleTime: 20 * time.Millisecond},
		{From: 9, FusionBytes: 1 << 20, Collectives: Collectives{SmallAllreduceBytes: 1 << 10, SharedRoundBytes: 8 << 20, Hierarchical: true}},
		{From: 12, FusionBytes: 1 << 20, SpinTime: 400 * time.Microsecond},
		{From: 13, Cache: CacheOff},
		{From: 14, FusionBytes: 1 << 20, Cache: CacheOn},
	} {
		msg := EncodeSettings(nil, s)
		if k, err := PeekKind(msg); err != nil || k != MsgSettings {
			t.Fatalf("PeekKind = %v, %v", k, err)
		}
		if got, err := DecodeSettings(msg); err != nil || got != s {
			t.Errorf("%+v: got %+v, %v", s, got, err)
		}
	}
	for name, s := range map[string]Settings{
		"step 0":          {From: 0, FusionBytes: 1},
		"negative fusion": {From: 3, FusionBytes: -1},
		"negative cycle":  {From: 3, CycleTime: -time.Millisecond},
		"negative spin":   {From: 3, SpinTime: -time.Microsecond},
		"cache switch 3":  {From: 3, Cache: 3},
	} {
		if _, err := DecodeSettings(EncodeSettings(nil, s)); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: err = %v, want ErrMalformed", name, err)
		}
	}
	if _, err := DecodeSettings(EncodeAbort(nil, Abort{})); !errors.Is(err, ErrMalformed) {
		t.Errorf("an abort decoded as settings: %v", err)
	}
	if _, err := DecodeSettings(EncodeSettings(nil, Settings{From: 5})[:4]); !errors.Is(err, ErrMalformed) {
		t.Errorf("a truncated message: %v", err)
	}
}

func FuzzDecodeKeepAlive(f *testing.F) {
	f.Add(EncodeKeepAlive(nil))
	f.Add(append(EncodeKeepAlive(nil), 0))
	f.Fuzz(func(t *testing.T, p []byte) {
		if err := DecodeKeepAlive(p); err == nil && string(p) != string(EncodeKeepAlive(nil)) {
			t.Errorf("%x decoded as a keep-alive", p)
		} else if err != nil && !errors.Is(err, ErrMalformed) {
			t.Errorf("%x: %v does not wrap ErrMalformed", p, err)
		}
	})
}
