package straggle

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 28, 9, 0, 0, 0, time.UTC)

// job drives a tracker through steps of ops whose per-rank arrival offsets come from delay.
type job struct {
	t    *Tracker
	now  time.Time
	ops  int
	step int
}

func (j *job) runStep(tb testing.TB, delay func(rank, op int) time.Duration) {
	tb.Helper()
	n := j.t.Size()
	for op := range j.ops {
		name := fmt.Sprintf("grad.%d", op)
		type arr struct {
			r  int
			at time.Time
		}
		arrs := make([]arr, n)
		for r := range n {
			arrs[r] = arr{r, j.now.Add(delay(r, op))}
		}
		// The coordinator sees them in time order.
		for i := 1; i < n; i++ {
			for k := i; k > 0 && arrs[k].at.Before(arrs[k-1].at); k-- {
				arrs[k], arrs[k-1] = arrs[k-1], arrs[k]
			}
		}
		for _, a := range arrs {
			if err := j.t.Arrive(a.at, name, a.r); err != nil {
				tb.Fatal(err)
			}
		}
		j.now = arrs[n-1].at.Add(time.Millisecond)
	}
	j.t.EndStep()
	j.step++
}

func TestSlowest(t *testing.T) {
	jitter := func(rng *rand.Rand, d time.Duration) time.Duration { return time.Duration(rng.Int64N(int64(d))) }
	tests := []struct {
		name     string
		n        int
		slow     int           // -1: none
		by       time.Duration // how late the slow rank is, on top of jitter
		jitter   time.Duration
		wantRank int // -1: nobody named at any point
	}{
		{"2 ranks, none slowed", 2, -1, 0, 5 * time.Millisecond, -1},
		{"4 ranks, none slowed", 4, -1, 0, 5 * time.Millisecond, -1},
		{"8 ranks, none slowed", 8, -1, 0, 5 * time.Millisecond, -1},
		{"64 ranks, none slowed", 64, -1, 0, 5 * time.Millisecond, -1},
		{"4 ranks, rank 3 slowed 40ms", 4, 3, 40 * time.Millisecond, 5 * time.Millisecond, 3},
		{"2 ranks, rank 0 slowed 20ms", 2, 0, 20 * time.Millisecond, 2 * time.Millisecond, 0},
		{"16 ranks, rank 9 slowed 10ms", 16, 9, 10 * time.Millisecond, 5 * time.Millisecond, 9},
		{"4 ranks, rank 1 last but under the floor", 4, 1, 300 * time.Microsecond, 100 * time.Microsecond, -1},
		{"1 rank", 1, -1, 0, time.Millisecond, -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr, err := New(tt.n, Config{})
			if err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(1, uint64(tt.n)))
			j := &job{t: tr, now: t0, ops: 5}
			named := map[int]int{}
			var last Verdict
			for range 300 {
				j.runStep(t, func(r, op int) time.Duration {
					d := jitter(rng, tt.jitter)
					if r == tt.slow {
						d += tt.by
					}
					return d
				})
				if v, ok := tr.Slowest(); ok {
					named[v.Rank]++
					last = v
				}
			}
			if tt.wantRank < 0 {
				if len(named) > 0 {
					t.Fatalf("named %v (last verdict: %v); want nobody", named, last)
				}
				return
			}
			// Once the window is full the slowed rank is named at every step, and nobody else ever.
			if len(named) != 1 || named[tt.wantRank] != 300-tr.cfg.Window+1 {
				t.Fatalf("named %v; want rank %d at each of %d steps", named, tt.wantRank, 300-tr.cfg.Window+1)
			}
			if last.Unit != "steps" || last.Samples != 20 || last.LastFraction() <= Threshold(tt.n) {
				t.Errorf("verdict %+v", last)
			}
			// Lateness is relative to the median of the other ranks: about the delay, give or take the jitter.
			if d := last.Lateness - tt.by; d < -tt.jitter || d > tt.jitter {
				t.Errorf("lateness %v, want %v ± %v", last.Lateness, tt.by, tt.jitter)
			}
			if s := last.String(); s == "" {
				t.Error("empty verdict text")
			}
		})
	}
}

func TestThreshold(t *testing.T) {
	for _, tt := range []struct {
		n    int
		want float64
	}{{1, 0.9}, {2, 0.9}, {3, 2.0 / 3}, {4, 0.5}, {1000, 0.5}} {
		if got := Threshold(tt.n); got != tt.want {
			t.Errorf("Threshold(%d) = %v, want %v", tt.n, got, tt.want)
		}
	}
}

// TestOpsUntilFirstStep: with no step marks the samples are ops, so a job that never marks steps
// still gets a verdict; the first mark switches to steps and starts the window anew.
func TestOpsUntilFirstStep(t *testing.T) {
	tr, _ := New(3, Config{Window: 10})
	now := t0
	for i := range 10 {
		name := fmt.Sprint("op", i)
		tr.Arrive(now, name, 0)
		tr.Arrive(now.Add(time.Millisecond), name, 1)
		tr.Arrive(now.Add(10*time.Millisecond), name, 2)
		now = now.Add(20 * time.Millisecond)
	}
	v, ok := tr.Slowest()
	if !ok || v.Rank != 2 || v.Unit != "ops" || v.Lateness != 9500*time.Microsecond || v.Last != 10 {
		t.Fatalf("verdict %+v, %v; want rank 2 in ops, 9.5ms late", v, ok)
	}
	tr.EndStep()
	if st := tr.Rank(2); st.Samples != 1 || st.Last != 1 {
		t.Fatalf("after the first step mark: %+v, want 1 sample", st)
	}
	if _, ok := tr.Slowest(); ok {
		t.Fatal("named a rank on one step")
	}
	if steps, ops := tr.Samples(); steps != 1 || ops != 10 {
		t.Fatalf("Samples = %d, %d", steps, ops)
	}
	tr.EndStep() // no op completed: no sample
	if st := tr.Rank(2); st.Samples != 1 {
		t.Fatalf("an empty step was a sample: %+v", st)
	}
}

func TestStalled(t *testing.T) {
	tr, _ := New(4, Config{})
	tr.Arrive(t0, "grad.fc1", 0)
	tr.Arrive(t0.Add(time.Second), "grad.fc1", 1)
	tr.Arrive(t0.Add(time.Second), "grad.fc1", 3)
	tr.Arrive(t0.Add(2*time.Second), "grad.fc2", 1)
	tr.Arrive(t0.Add(3*time.Second), "grad.fc0", 0)
	for _, r := range []int{0, 1, 2, 3} {
		tr.Arrive(t0.Add(3*time.Second), "done", r)
	}
	tests := []struct {
		older    time.Duration
		maxRanks int
		want     string
	}{
		{61 * time.Second, 4, "[]"},
		{59 * time.Second, 4, "[{grad.fc1 3 [2] 1}]"},
		{58 * time.Second, 2, "[{grad.fc1 3 [2] 1} {grad.fc2 1 [0 2] 3}]"},
		{0, 4, "[{grad.fc1 3 [2] 1} {grad.fc2 1 [0 2 3] 3} {grad.fc0 1 [1 2 3] 3}]"},
	}
	now := t0.Add(60 * time.Second)
	for _, tt := range tests {
		got := "["
		for i, p := range tr.Stalled(now, tt.older, tt.maxRanks) {
			if i > 0 {
				got += " "
			}
			got += fmt.Sprintf("{%s %d %v %d}", p.Name, p.Arrived, p.Missing, p.MissingCount)
		}
		got += "]"
		if got != tt.want {
			t.Errorf("Stalled(%v, %d) = %s, want %s", tt.older, tt.maxRanks, got, tt.want)
		}
	}
	tr.Answered("grad.fc1")
	tr.Answered("never.seen")
	if got := tr.Stalled(now, 0, 4); len(got) != 2 || got[0].Name != "grad.fc2" {
		t.Fatalf("after Answered: %+v", got)
	}
}

func TestArriveChecks(t *testing.T) {
	if _, err := New(0, Config{}); err == nil {
		t.Fatal("New(0) succeeded")
	}
	tr, _ := New(2, Config{})
	for _, r := range []int{-1, 2} {
		if err := tr.Arrive(t0, "x", r); err == nil {
			t.Errorf("rank %d accepted", r)
		}
	}
	// A rank arriving twice keeps its first time and does not complete the op alone.
	tr.Arrive(t0, "x", 0)
	tr.Arrive(t0.Add(time.Second), "x", 0)
	if p := tr.Stalled(t0.Add(time.Hour), 0, 2); len(p) != 1 || p[0].Arrived != 1 || !p[0].Since.Equal(t0) {
		t.Fatalf("pending %+v", p)
	}
}

// TestBounded: a rank that never submits leaves ops pending; the tracker keeps at most MaxPending
// of them, and a long run keeps the window's size.
func TestBounded(t *testing.T) {
	tr, _ := New(3, Config{MaxPending: 8, Window: 5})
	now := t0
	for i := range 10000 {
		now = now.Add(time.Millisecond)
		tr.Arrive(now, fmt.Sprint("op", i), 0)
		tr.Arrive(now, fmt.Sprint("op", i), 1) // rank 2 never comes
	}
	if len(tr.pending) != 8 {
		t.Fatalf("%d pending ops kept, want 8", len(tr.pending))
	}
	if p := tr.Stalled(now, 0, 3); p[0].Name != "op9992" || p[7].Name != "op9999" {
		t.Fatalf("kept %s..%s, want the newest", p[0].Name, p[7].Name)
	}
	j := &job{t: tr, now: now, ops: 3}
	for range 1000 {
		j.runStep(t, func(r, op int) time.Duration { return time.Duration(r) * time.Millisecond })
	}
	if st := tr.Rank(2); st.Samples != 5 || st.Last != 5 {
		t.Fatalf("rank 2: %+v", st)
	}
}

// TestSteadyStateAllocs: a steady step allocates nothing but the names the caller made.
func TestSteadyStateAllocs(t *testing.T) {
	tr, _ := New(8, Config{})
	names := []string{"a", "b", "c"}
	now := t0
	step := func() {
		for _, name := range names {
			for r := range 8 {
				now = now.Add(time.Microsecond)
				tr.Arrive(now, name, r)
			}
		}
		tr.EndStep()
	}
	step()
	if a := testing.AllocsPerRun(100, step); a != 0 {
		t.Fatalf("a step allocates %v times", a)
	}
}

func BenchmarkArrive1000Ranks(b *testing.B) {
	tr, _ := New(1000, Config{})
	now := t0
	for b.Loop() {
		for r := range 1000 {
			tr.Arrive(now, "grad", r)
		}
		now = now.Add(time.Millisecond)
	}
}

func TestMedianOfOthers(t *testing.T) {
	for _, tt := range []struct {
		s    []int64
		v    int64
		want int64
	}{
		{[]int64{5}, 5, 5},
		{[]int64{0, 10}, 10, 0},
		{[]int64{0, 10}, 0, 10},
		{[]int64{0, 1, 40}, 40, 0}, // others 0,1: mean of the two, rounded down
		{[]int64{0, 2, 40}, 40, 1},
		{[]int64{0, 2, 40}, 0, 21},
		{[]int64{0, 1, 2, 40}, 40, 1},
		{[]int64{0, 1, 2, 40}, 0, 2},
		{[]int64{3, 3, 3, 3}, 3, 3},
	} {
		if got := medianOfOthers(tt.s, tt.v); got != tt.want {
			t.Errorf("medianOfOthers(%v, %d) = %d, want %d", tt.s, tt.v, got, tt.want)
		}
	}
}
