package report

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/observe/flight"
	"github.com/kolo-dl/kolo/internal/observe/straggle"
)

var t0 = time.Unix(1_800_000_000, 0)

func full() *Report {
	cur := Op{Name: "grad.fc1", Kind: "allreduce", Bytes: 4096, State: flight.Negotiated, Submitted: t0, Negotiated: t0.Add(time.Millisecond)}
	return &Report{
		Rank: 3, Host: "node2", Seq: 42, At: t0.Add(time.Second), Up: time.Minute,
		Steps: 1000, StepMedian: 120 * time.Millisecond, StepP95: 180 * time.Millisecond,
		InCollectives: 20 * time.Second, BytesReduced: 1 << 40, OpsDone: 50000, OpsFailed: 1,
		OpLatency: []KindLatency{{Kind: "allreduce", Counts: [LatencyBounds]uint64{1, 2, 3, 0, 0, 0, 0, 0, 0, 0, 0, 9}, Sum: time.Hour}},
		Current:   &cur, Open: 2,
		Last: []Op{{Name: "grad.fc2", Kind: "allreduce", Bytes: 8, State: flight.Done, Submitted: t0, Negotiated: t0, Started: t0, Finished: t0.Add(3 * time.Millisecond)}},
		Straggle: &Straggle{Unit: "steps", Samples: 20, Slowest: 3,
			Ranks:   []Late{{Rank: 3, Last: 19, Lateness: 41 * time.Millisecond}, {Rank: 0, Last: 1, Lateness: -time.Millisecond}},
			Stalled: []Stalled{{Name: "grad.fc0", Since: t0, Arrived: 3, Missing: []int{5}, MissingCount: 1}}},
	}
}

// same compares reports by their encodings: times decode in the local zone, so == and DeepEqual
// would see a difference where there is none.
func same(a, b *Report) bool { return bytes.Equal(Encode(nil, a), Encode(nil, b)) }

func TestRoundTrip(t *testing.T) {
	long := strings.Repeat("x", MaxString+10)
	many := full()
	for i := range MaxLate {
		many.Straggle.Ranks = append(many.Straggle.Ranks, Late{Rank: i})
	}
	for i := range 20 { // more than every other bound
		many.Last = append(many.Last, Op{Name: fmt.Sprint("op", i), State: flight.Done})
		many.Straggle.Stalled = append(many.Straggle.Stalled, Stalled{Name: "s", Missing: make([]int, 40), MissingCount: 40})
		many.OpLatency = append(many.OpLatency, KindLatency{Kind: fmt.Sprint("k", i)})
	}
	tests := []struct {
		name string
		in   *Report
		// check, if set, checks the decoded report (for inputs Encode cuts).
		check func(*Report) error
	}{
		{"zero", &Report{}, nil},
		{"full", full(), nil},
		{"rank 0 without straggle", &Report{Rank: 0, Host: "h", Steps: 1}, nil},
		{"negative durations", &Report{Rank: 1, StepMedian: -1, InCollectives: -5}, nil},
		{"long host cut", &Report{Host: long}, func(r *Report) error {
			if len(r.Host) != MaxString {
				return fmt.Errorf("host of %d bytes", len(r.Host))
			}
			return nil
		}},
		{"lists cut to bounds, newest ops kept", many, func(r *Report) error {
			if len(r.Last) != MaxLast || r.Last[MaxLast-1].Name != "op19" || len(r.Straggle.Stalled) != MaxStalled ||
				len(r.Straggle.Stalled[1].Missing) != MaxMissing || len(r.Straggle.Ranks) != MaxLate || len(r.OpLatency) != MaxKinds {
				return fmt.Errorf("not cut as expected: %d last (%s), %d stalled, %d late, %d kinds", len(r.Last), r.Last[len(r.Last)-1].Name, len(r.Straggle.Stalled), len(r.Straggle.Ranks), len(r.OpLatency))
			}
			return nil
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := Encode(nil, tt.in)
			got, err := Decode(b)
			if err != nil {
				t.Fatal(err)
			}
			if tt.check != nil {
				if err := tt.check(&got); err != nil {
					t.Fatal(err)
				}
				return
			}
			if !same(&got, tt.in) {
				t.Fatalf("got %+v\nwant %+v", got, *tt.in)
			}
			if !got.At.Equal(tt.in.At) || got.Rank != tt.in.Rank || got.Host != tt.in.Host {
				t.Fatalf("fields differ: %+v", got)
			}
		})
	}
	if n := len(Encode(nil, full())); n > 400 {
		t.Errorf("a full report takes %d bytes; it should stay compact", n)
	}
}

func TestDecodeRejects(t *testing.T) {
	good := Encode(nil, full())
	tests := []struct {
		name string
		b    []byte
	}{
		{"empty", nil},
		{"version", append([]byte{9}, good[1:]...)},
		{"truncated", good[:len(good)-1]},
		{"trailing", append(bytes.Clone(good), 0)},
	}
	// A list count past its bound: an empty report's fixed fields take 13 bytes, then comes the
	// count of op kinds.
	e := Encode(nil, &Report{})
	if len(e) != 18 || e[13] != 0 {
		t.Fatalf("empty report encodes as % x: the test's offsets are stale", e)
	}
	bad := append(binary.AppendUvarint(bytes.Clone(e[:13]), MaxKinds+1), e[14:]...)
	tests = append(tests, struct {
		name string
		b    []byte
	}{"count past bound", bad})
	flag := bytes.Clone(e)
	flag[14] = 2
	tests = append(tests, struct {
		name string
		b    []byte
	}{"flag not 0 or 1", flag})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := Decode(tt.b); !errors.Is(err, ErrMalformed) {
				t.Fatalf("Decode = %v, want ErrMalformed", err)
			}
		})
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(Encode(nil, full()))
	f.Add(Encode(nil, &Report{}))
	f.Add([]byte{1})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := Decode(b)
		if err != nil {
			return
		}
		// Whatever decodes re-encodes to something that decodes to the same report.
		again, err := Decode(Encode(nil, &r))
		if err != nil {
			t.Fatalf("re-encoded report does not decode: %v", err)
		}
		if !same(&r, &again) {
			t.Fatalf("round trip changed the report:\n%+v\n%+v", r, again)
		}
	})
}

func TestMeter(t *testing.T) {
	m := NewMeter(t0)
	rec := flight.New(8)
	for i := range 100 {
		m.Step(t0.Add(time.Duration(i+1) * 100 * time.Millisecond)) // every step 100 ms...
	}
	m.Step(t0.Add(10*time.Second + 900*time.Millisecond)) // ...but one of 900 ms
	for _, l := range []time.Duration{50 * time.Microsecond, 2 * time.Millisecond, 2 * time.Millisecond, time.Minute} {
		m.OpDone("allreduce", l, false)
	}
	m.OpDone("broadcast", time.Second, true)
	m.Collective(time.Second, 1000)
	m.Collective(time.Second, -1)
	a := rec.Submit(t0, "a", "allreduce", "float32", 4, 0)
	rec.Finished(a, t0, false)
	rec.Submit(t0, "b", "allreduce", "float32", 4, 0)
	var r Report
	m.Fill(&r, t0.Add(time.Minute), rec.Snapshot())
	want := Report{At: t0.Add(time.Minute), Up: time.Minute, Steps: 101, StepMedian: 100 * time.Millisecond, StepP95: 100 * time.Millisecond,
		InCollectives: 2 * time.Second, BytesReduced: 1000, OpsDone: 4, OpsFailed: 1,
		OpLatency: []KindLatency{
			{Kind: "allreduce", Counts: [LatencyBounds]uint64{1, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 1}, Sum: time.Minute + 4*time.Millisecond + 50*time.Microsecond},
			{Kind: "broadcast", Counts: [LatencyBounds]uint64{0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0}, Sum: time.Second}},
		Current: &Op{Name: "b", Kind: "allreduce", Bytes: 4, State: flight.Submitted, Submitted: t0}, Open: 1,
		Last: []Op{{Name: "a", Kind: "allreduce", Bytes: 4, State: flight.Done, Submitted: t0, Finished: t0}},
	}
	if !reflect.DeepEqual(r, want) {
		t.Fatalf("got  %+v\nwant %+v", r, want)
	}
	// p95 picks up the slow step once it is one in twenty.
	for i := range 20 {
		m.Step(t0.Add(time.Minute + time.Duration(i)*time.Second))
	}
	m.Fill(&r, t0.Add(2*time.Minute), rec.Snapshot())
	if r.StepP95 < 900*time.Millisecond {
		t.Fatalf("p95 %v, want the slow steps", r.StepP95)
	}
}

func TestMeterAllocs(t *testing.T) {
	m := NewMeter(t0)
	m.OpDone("allreduce", 0, false)
	if a := testing.AllocsPerRun(100, func() {
		m.Step(t0)
		m.OpDone("allreduce", time.Millisecond, false)
		m.Collective(time.Millisecond, 64)
	}); a != 0 {
		t.Fatalf("%v allocations", a)
	}
}

func TestSummarize(t *testing.T) {
	mk := func(rank int, host string, steps uint64, med time.Duration, at int) *Report {
		return &Report{Rank: rank, Host: host, Steps: steps, StepMedian: med, At: t0.Add(time.Duration(at) * time.Second), InCollectives: time.Second, BytesReduced: 10}
	}
	reports := []*Report{
		mk(0, "node1", 100, 100*time.Millisecond, 10),
		mk(1, "node1", 99, 110*time.Millisecond, 9),
		nil, // not heard from
		mk(3, "node2", 90, 300*time.Millisecond, 2),
		mk(4, "node2", 100, 100*time.Millisecond, 10),
	}
	s := Summarize(reports, 2)
	var got []string
	for _, h := range s.Hosts {
		got = append(got, fmt.Sprintf("%s ranks=%d steps=%d..%d med=%v coll=%v bytes=%d oldest=%v", h.Host, h.Ranks, h.MinSteps, h.MaxSteps, h.StepMedian, h.InCollectives, h.BytesReduced, h.Oldest.Sub(t0)))
	}
	for _, r := range s.Slowest {
		got = append(got, fmt.Sprint("slow ", r.Rank))
	}
	for _, r := range s.Stale {
		got = append(got, fmt.Sprint("stale ", r.Rank))
	}
	want := []string{
		"node1 ranks=2 steps=99..100 med=110ms coll=2s bytes=20 oldest=9s",
		"node2 ranks=2 steps=90..100 med=300ms coll=2s bytes=20 oldest=2s",
		"slow 3", "slow 1", "stale 3", "stale 1",
	}
	if s.Ranks != 4 || !reflect.DeepEqual(got, want) {
		t.Fatalf("ranks %d\ngot  %q\nwant %q", s.Ranks, got, want)
	}
	if s := Summarize(reports, 0); len(s.Slowest) != 0 || len(s.Stale) != 0 {
		t.Fatal("worst 0 kept ranks")
	}
}

func TestInterval(t *testing.T) {
	for _, tt := range []struct {
		n    int
		want time.Duration
	}{{1, 250 * time.Millisecond}, {250, 250 * time.Millisecond}, {1000, time.Second}, {4000, 4 * time.Second}} {
		if got := Interval(tt.n); got != tt.want {
			t.Errorf("Interval(%d) = %v, want %v", tt.n, got, tt.want)
		}
	}
}

func BenchmarkSummarize1000(b *testing.B) {
	reports := make([]*Report, 1000)
	for i := range reports {
		reports[i] = &Report{Rank: i, Host: fmt.Sprint("node", i/8), StepMedian: time.Duration(i*7919%1000) * time.Millisecond, At: t0.Add(time.Duration(i*104729%1000) * time.Millisecond)}
	}
	for b.Loop() {
		Summarize(reports, 5)
	}
}

func TestKeys(t *testing.T) {
	for _, tt := range []struct{ got, want string }{
		{Key("job1", 3), "observe/job1/report/3"},
		{FlightKey("job1", 3), "observe/job1/flight/3"},
		{DumpKey("job1"), "observe/job1/dump"},
	} {
		if tt.got != tt.want {
			t.Errorf("got %q, want %q", tt.got, tt.want)
		}
	}
}

func TestStraggleOf(t *testing.T) {
	for _, n := range []int{4, MaxLate + 36} {
		t.Run(fmt.Sprint(n, " ranks"), func(t *testing.T) {
			tr, _ := straggle.New(n, straggle.Config{})
			now := t0
			for step := range 25 {
				for op := range 2 {
					name := fmt.Sprint("grad.", op)
					for r := range n {
						// rank r arrives r µs late, rank 1 50 ms late
						d := time.Duration(r) * time.Microsecond
						if r == 1 {
							d = 50 * time.Millisecond
						}
						tr.Arrive(now.Add(d), name, r)
					}
					now = now.Add(100 * time.Millisecond)
				}
				if step < 24 {
					tr.EndStep()
				}
			}
			tr.Arrive(now, "stuck", 0) // pending since now
			s := StraggleOf(tr, now.Add(time.Minute), 30*time.Second)
			if s.Unit != "steps" || s.Samples != 20 || s.Slowest != 1 {
				t.Fatalf("straggle %+v", s)
			}
			if len(s.Ranks) != min(n, MaxLate) || s.Ranks[0].Rank != 1 || s.Ranks[0].Last != 20 {
				t.Fatalf("%d ranks, first %+v", len(s.Ranks), s.Ranks[0])
			}
			for i := 1; i < len(s.Ranks); i++ {
				if s.Ranks[i].Lateness > s.Ranks[i-1].Lateness {
					t.Fatalf("not latest first at %d: %+v", i, s.Ranks)
				}
			}
			// Past MaxLate the latest are kept: the highest ranks (r µs late) after rank 1.
			if n > MaxLate && s.Ranks[1].Rank != n-1 {
				t.Fatalf("second latest is rank %d, want %d", s.Ranks[1].Rank, n-1)
			}
			if len(s.Stalled) != 1 || s.Stalled[0].Name != "stuck" || s.Stalled[0].MissingCount != n-1 || len(s.Stalled[0].Missing) != min(n-1, MaxMissing) {
				t.Fatalf("stalled %+v", s.Stalled)
			}
			// It travels.
			r := Report{Rank: 0, Straggle: s}
			back, err := Decode(Encode(nil, &r))
			if err != nil || !same(&back, &r) {
				t.Fatalf("round trip: %v", err)
			}
		})
	}
}
