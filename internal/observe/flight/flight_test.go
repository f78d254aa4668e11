package flight

import (
	"encoding/json"
	"sync"
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 28, 9, 0, 0, 0, time.UTC)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

func TestRecorderLifecycle(t *testing.T) {
	type step struct {
		op    string // "submit", "neg", "start", "done", "fail"
		which int    // index into the IDs returned by the submits so far
		ms    int
	}
	tests := []struct {
		name   string
		size   int
		steps  []step
		want   []State // states of the kept ops, oldest first
		total  uint64
		cur    int // index into kept ops of Current, -1 none
		lastOK bool
	}{
		{"empty", 4, nil, nil, 0, -1, false},
		{"one submitted", 4, []step{{"submit", 0, 0}}, []State{Submitted}, 1, 0, false},
		{"full life", 4, []step{{"submit", 0, 0}, {"neg", 0, 1}, {"start", 0, 2}, {"done", 0, 3}}, []State{Done}, 1, -1, true},
		{"failed before start", 4, []step{{"submit", 0, 0}, {"fail", 0, 1}, {"start", 0, 2}}, []State{Failed}, 1, -1, true},
		{"no moving back", 4, []step{{"submit", 0, 0}, {"start", 0, 1}, {"neg", 0, 2}}, []State{Started}, 1, 0, false},
		{"current is oldest open", 4, []step{{"submit", 0, 0}, {"submit", 1, 1}, {"submit", 2, 2}, {"done", 0, 3}, {"done", 2, 4}}, []State{Done, Submitted, Done}, 3, 1, true},
		{"wraps", 2, []step{{"submit", 0, 0}, {"submit", 1, 1}, {"submit", 2, 2}, {"done", 1, 3}}, []State{Done, Submitted}, 3, 1, true},
		{"stale id ignored", 2, []step{{"submit", 0, 0}, {"submit", 1, 1}, {"submit", 2, 2}, {"done", 0, 3}}, []State{Submitted, Submitted}, 3, 0, false},
		{"size clamps to 1", 0, []step{{"submit", 0, 0}, {"submit", 1, 1}}, []State{Submitted}, 2, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := New(tt.size)
			var ids []ID
			for _, s := range tt.steps {
				switch s.op {
				case "submit":
					ids = append(ids, r.Submit(at(s.ms), "op", "allreduce", "float32", 4, 0))
				case "neg":
					r.Negotiated(ids[s.which], at(s.ms))
				case "start":
					r.Started(ids[s.which], at(s.ms))
				case "done":
					r.Finished(ids[s.which], at(s.ms), false)
				case "fail":
					r.Finished(ids[s.which], at(s.ms), true)
				}
			}
			snap := r.Snapshot()
			if snap.Total != tt.total {
				t.Errorf("Total = %d, want %d", snap.Total, tt.total)
			}
			if len(snap.Ops) != len(tt.want) {
				t.Fatalf("kept %d ops, want %d: %+v", len(snap.Ops), len(tt.want), snap.Ops)
			}
			for i, o := range snap.Ops {
				if o.State != tt.want[i] {
					t.Errorf("op %d state %v, want %v", i, o.State, tt.want[i])
				}
				if i > 0 && o.Seq != snap.Ops[i-1].Seq+1 {
					t.Errorf("op %d seq %d after %d", i, o.Seq, snap.Ops[i-1].Seq)
				}
			}
			cur, ok := snap.Current()
			if ok != (tt.cur >= 0) || ok && cur.Seq != snap.Ops[tt.cur].Seq {
				t.Errorf("Current = %+v, %v; want index %d", cur, ok, tt.cur)
			}
			if _, ok := snap.LastFinished(); ok != tt.lastOK {
				t.Errorf("LastFinished ok = %v, want %v", ok, tt.lastOK)
			}
		})
	}
}

func TestStampsTimes(t *testing.T) {
	r := New(8)
	id := r.Submit(at(0), "grad.fc1", "allreduce", "float32", 4096, 2)
	r.Negotiated(id, at(5))
	r.Started(id, at(6))
	r.Finished(id, at(9), false)
	r.Negotiated(0, at(10)) // the zero ID is a no-op
	got := r.Snapshot().Ops[0]
	want := Op{Seq: 1, Name: "grad.fc1", Kind: "allreduce", DType: "float32", Bytes: 4096, Set: 2, State: Done,
		Submitted: at(0), Negotiated: at(5), Started: at(6), Finished: at(9)}
	if got != want {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
}

func TestTail(t *testing.T) {
	r := New(4)
	for range 6 {
		r.Submit(at(0), "x", "barrier", "", 0, 0)
	}
	s := r.Snapshot()
	for _, tt := range []struct{ k, n int }{{-1, 0}, {0, 0}, {2, 2}, {4, 4}, {9, 4}} {
		tail := s.Tail(tt.k)
		if len(tail) != tt.n {
			t.Errorf("Tail(%d) has %d ops, want %d", tt.k, len(tail), tt.n)
		}
		if len(tail) > 0 && tail[len(tail)-1].Seq != 6 {
			t.Errorf("Tail(%d) ends at seq %d, want 6", tt.k, tail[len(tail)-1].Seq)
		}
	}
}

func TestSnapshotJSONRoundTrip(t *testing.T) {
	r := New(4)
	a := r.Submit(at(0), "grad.fc1", "allreduce", "float32", 4096, 0)
	r.Negotiated(a, at(1))
	r.Submit(at(2), "grad.fc2", "allgather", "int64", 8, 1)
	s := r.Snapshot()
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var back Snapshot
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatalf("%v in %s", err, b)
	}
	if len(back.Ops) != 2 || back.Ops[0] != s.Ops[0] || back.Ops[1] != s.Ops[1] || back.Total != 2 {
		t.Fatalf("round trip: got %+v, want %+v (json %s)", back, s, b)
	}
	var st State
	if err := st.UnmarshalText([]byte("bogus")); err == nil {
		t.Fatal("unknown state parsed")
	}
}

func TestRecordAllocatesNothing(t *testing.T) {
	r := New(64)
	now := at(0)
	allocs := testing.AllocsPerRun(1000, func() {
		id := r.Submit(now, "grad.fc1", "allreduce", "float32", 4096, 0)
		r.Negotiated(id, now)
		r.Started(id, now)
		r.Finished(id, now, false)
	})
	if allocs != 0 {
		t.Fatalf("recording allocates %v times per op", allocs)
	}
}

// TestConcurrentRecordAndSnapshot is for -race: the engine records while a reporter snapshots.
func TestConcurrentRecordAndSnapshot(t *testing.T) {
	r := New(16)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		for i := range 2000 {
			id := r.Submit(at(i), "op", "allreduce", "float32", 4, 0)
			r.Started(id, at(i))
			r.Finished(id, at(i+1), false)
		}
	}()
	go func() {
		defer wg.Done()
		for range 200 {
			s := r.Snapshot()
			for i := 1; i < len(s.Ops); i++ {
				if s.Ops[i].Seq != s.Ops[i-1].Seq+1 {
					t.Errorf("snapshot out of order: %d after %d", s.Ops[i].Seq, s.Ops[i-1].Seq)
					return
				}
			}
		}
	}()
	wg.Wait()
}

func BenchmarkRecordOp(b *testing.B) {
	r := New(256)
	now := at(0)
	for b.Loop() {
		id := r.Submit(now, "grad.fc1", "allreduce", "float32", 4096, 0)
		r.Negotiated(id, now)
		r.Started(id, now)
		r.Finished(id, now, false)
	}
}

// FuzzSnapshotJSON: a rank's recorder reaches the launcher as JSON through the store; whatever
// decodes re-encodes to the same snapshot.
func FuzzSnapshotJSON(f *testing.F) {
	r := New(4)
	id := r.Submit(at(0), "grad.fc1", "allreduce", "float32", 4096, 0)
	r.Negotiated(id, at(1))
	b, _ := json.Marshal(r.Snapshot())
	f.Add(b)
	f.Add([]byte(`{"ops":[{"state":"bogus"}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var s Snapshot
		if json.Unmarshal(b, &s) != nil {
			return
		}
		again, err := json.Marshal(s)
		if err != nil {
			t.Fatalf("a decoded snapshot does not encode: %v", err)
		}
		var back Snapshot
		if err := json.Unmarshal(again, &back); err != nil {
			t.Fatalf("re-encoded snapshot does not decode: %v\n%s", err, again)
		}
	})
}
