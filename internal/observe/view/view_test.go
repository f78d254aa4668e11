package view

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/observe/flight"
	"github.com/kolo-dl/kolo/internal/observe/report"
)

// now is the launcher's clock; each rank's clock is skewed by skew(rank) to show that no clocks
// need agree.
var now = time.Date(2026, 11, 28, 10, 0, 0, 0, time.UTC)

func skew(rank int) time.Duration { return time.Duration(rank) * time.Hour }

// rankClock is rank's clock reading at launcher time t.
func rankClock(rank int, t time.Time) time.Time { return t.Add(skew(rank)) }

func host(rank int) string { return fmt.Sprintf("node%d", rank/2+1) }

// steady is rank's report at launcher time t in a healthy job.
func steady(rank int, seq uint64, t time.Time) report.Report {
	return report.Report{
		Rank: rank, Host: host(rank), Seq: seq, At: rankClock(rank, t), Up: 100 * time.Second,
		Steps: 1000 + uint64(rank%2), StepMedian: 120 * time.Millisecond, StepP95: 180 * time.Millisecond,
		InCollectives: 25 * time.Second, BytesReduced: 400_000_000_000,
	}
}

func fold(t *testing.T, s *State, at time.Time, r report.Report) {
	t.Helper()
	if err := s.Fold(at, r); err != nil {
		t.Fatal(err)
	}
}

func TestStatus(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T, s *State)
		want  []string
	}{
		{"nothing heard", func(t *testing.T, s *State) {}, []string{"kolo: waiting for the first reports of 4 ranks"}},
		{"steady, nobody named", func(t *testing.T, s *State) {
			for i := range 11 {
				at := now.Add(time.Duration(i-10) * time.Second)
				for r := range 4 {
					rep := steady(r, uint64(i+1), at)
					rep.Steps = uint64(900 + 10*i)
					if r == 0 {
						rep.Straggle = &report.Straggle{Unit: "steps", Samples: 20, Slowest: -1}
					}
					fold(t, s, at, rep)
				}
			}
		}, []string{"kolo: step 1000 · 10.0 steps/s · 120 ms/step (p95 180 ms) · 4 ranks on 2 hosts · 1.6 TB reduced"}},
		{"slowest named, a stall, a silent rank, a reset", func(t *testing.T, s *State) {
			s.Reset(4)
			for r := range 4 {
				at := now
				if r == 2 {
					at = now.Add(-12 * time.Second)
				}
				rep := steady(r, 1, at)
				if r == 0 {
					rep.Straggle = &report.Straggle{Unit: "steps", Samples: 20, Slowest: 3,
						Ranks: []report.Late{{Rank: 3, Last: 18, Lateness: 41 * time.Millisecond}, {Rank: 1, Last: 1, Lateness: time.Millisecond}},
						Stalled: []report.Stalled{
							{Name: "grad.fc1", Since: rankClock(0, now.Add(-61*time.Second)), Arrived: 3, Missing: []int{2}, MissingCount: 1},
							{Name: "grad.fc2", Since: rankClock(0, now.Add(-60*time.Second)), Arrived: 1, Missing: []int{0, 2, 3}, MissingCount: 3},
							{Name: "grad.fc3", Since: rankClock(0, now.Add(-60*time.Second)), Arrived: 1, Missing: []int{0, 2, 3}, MissingCount: 3},
						}}
				}
				fold(t, s, at, rep)
			}
		}, []string{
			"kolo: step 1001 · 120 ms/step (p95 180 ms) · 4 ranks on 2 hosts · 1.6 TB reduced",
			"slowest: rank 3 on node2 arrives last in 90% of steps, 41 ms after the median of the others",
			`stalled: "grad.fc1" for 61 s, waiting on rank 2 (3 of 4 ranks submitted it)`,
			`stalled: "grad.fc2" for 60 s, waiting on ranks 0, 2-3 (1 of 4 ranks submitted it)`,
			"stalled: 1 more op",
			"silent: rank 2 on node2 (no report for 12 s)",
			"elastic: 1 reset, 4 ranks now",
		}},
		{"some ranks not heard from, missing ranks cut", func(t *testing.T, s *State) {
			rep := steady(0, 1, now)
			rep.Straggle = &report.Straggle{Unit: "ops", Samples: 5, Slowest: -1, Stalled: []report.Stalled{
				{Name: "x", Since: now.Add(-2 * time.Minute), Arrived: 1, Missing: []int{1, 2}, MissingCount: 3}}}
			fold(t, s, now, rep)
		}, []string{
			"kolo: step 1000 · 120 ms/step (p95 180 ms) · 1 of 4 ranks reporting, on 1 host · 400.0 GB reduced",
			`stalled: "x" for 120 s, waiting on ranks 1-2 and 1 more (1 of 4 ranks submitted it)`,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := New(4)
			tt.setup(t, s)
			got := s.Status(now, 10*time.Second)
			if strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
				t.Fatalf("got:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
		})
	}
}

func TestFold(t *testing.T) {
	s := New(2)
	fold(t, s, now, steady(1, 5, now))
	old := steady(1, 4, now)
	old.Steps = 1
	fold(t, s, now.Add(time.Second), old) // older Seq: ignored
	if r, at := s.Report(1); r.Steps != 1001 || !at.Equal(now) {
		t.Fatalf("an older report replaced a newer one: %+v at %v", r, at)
	}
	if err := s.Fold(now, steady(2, 1, now)); err == nil {
		t.Fatal("a rank outside the world was folded")
	}
	s.Reset(3)
	if r, _ := s.Report(1); r != nil || s.Size() != 3 || s.Resets() != 1 {
		t.Fatalf("after Reset: report %v, size %d, resets %d", r, s.Size(), s.Resets())
	}
	fold(t, s, now, steady(2, 1, now))
	// A stall counts once however many reports carry it.
	for i := range 3 {
		rep := steady(0, uint64(i+1), now)
		rep.Straggle = &report.Straggle{Slowest: -1, Stalled: []report.Stalled{{Name: "a", Since: now}}}
		fold(t, s, now, rep)
	}
	if s.Stalls() != 1 {
		t.Fatalf("Stalls = %d, want 1", s.Stalls())
	}
}

func TestStepRate(t *testing.T) {
	s := New(1)
	if got := s.StepRate(now, RateWindow); got != 0 {
		t.Fatalf("rate %v with nothing seen", got)
	}
	for i := range 40 { // 2 steps/s for 20 s, then 5 steps/s
		rep := steady(0, uint64(i+1), now)
		steps := uint64(i)
		if i >= 20 {
			steps = 20 + uint64(i-20)*5/2
		}
		rep.Steps = steps * 1
		fold(t, s, now.Add(time.Duration(i)*500*time.Millisecond), rep)
	}
	end := now.Add(39 * 500 * time.Millisecond)
	if got := s.StepRate(end, 5*time.Second); got < 4.5 || got > 5.5 {
		t.Fatalf("rate over the last 5 s = %v, want about 5", got)
	}
}

func TestEndTable(t *testing.T) {
	s := New(4)
	for r := range 3 { // rank 3 never reported
		rep := steady(r, 1, now)
		if r == 0 {
			rep.Straggle = &report.Straggle{Unit: "steps", Samples: 20, Slowest: -1,
				Ranks: []report.Late{{Rank: 1, Lateness: 2 * time.Millisecond}, {Rank: 0, Lateness: -300 * time.Microsecond}}}
		}
		fold(t, s, now, rep)
	}
	want := `| rank | host  | steps | step median | step p95 | lateness | in collectives |  reduced |
|-----:|:------|------:|------------:|---------:|---------:|---------------:|---------:|
|    0 | node1 |  1000 |      120 ms |   180 ms | -0.30 ms |     25 s (25%) | 400.0 GB |
|    1 | node1 |  1001 |      120 ms |   180 ms |     2 ms |     25 s (25%) | 400.0 GB |
|    2 | node2 |  1000 |      120 ms |   180 ms |        - |     25 s (25%) | 400.0 GB |
|    3 | -     |     - |           - |        - |        - |              - |        - |
`
	if got := s.EndTable(); got != want {
		t.Fatalf("got:\n%s\nwant:\n%s", got, want)
	}
}

func TestEndTableLargeJob(t *testing.T) {
	s := New(PerRankRows + 6) // 70 ranks on 35 hosts
	for r := range s.Size() {
		rep := steady(r, 1, now)
		rep.Host = fmt.Sprintf("n%02d", r/35)
		if r == 42 {
			rep.StepMedian = 900 * time.Millisecond
		}
		fold(t, s, now, rep)
	}
	got := s.EndTable()
	want := `| host | ranks |     steps | slowest step median | in collectives | reduced |
|:-----|------:|----------:|--------------------:|---------------:|--------:|
| n00  |    35 | 1000-1001 |              120 ms |         14m35s | 14.0 TB |
| n01  |    35 | 1000-1001 |              900 ms |         14m35s | 14.0 TB |

slowest ranks:
`
	if !strings.HasPrefix(got, want) {
		t.Fatalf("got:\n%s\nwant it to start:\n%s", got, want)
	}
	if rows := strings.Count(got, "\n"); rows != 4+3+2+16 {
		t.Fatalf("%d lines, want host table, slowest 16 ranks:\n%s", rows, got)
	}
	if !strings.Contains(got, "|   42 | n01  |  1000 |      900 ms |") {
		t.Fatalf("slowest rank 42 not first:\n%s", got)
	}
}

// stallJob: rank 2 is stuck in a negotiated allreduce whose data rank 5 never sends (rank 5
// finished grad.fc2 and submitted nothing since); ranks 0, 1, 3, 4 are in it too.
func stallJob(t *testing.T) *State {
	s := New(6)
	for r := range 6 {
		rep := steady(r, 1, now)
		if r == 5 {
			rep.Last = []report.Op{{Name: "grad.fc2", Kind: "allreduce", State: flight.Done, Finished: rankClock(5, now.Add(-64*time.Second))}}
		} else {
			sub := -61 * time.Second
			if r != 2 {
				sub = -59 * time.Second
			}
			rep.Current = &report.Op{Name: "grad.fc1", Kind: "allreduce", State: flight.Negotiated, Submitted: rankClock(r, now.Add(sub))}
			rep.Last = []report.Op{{Name: "grad.fc2", Kind: "allreduce", State: flight.Done, Finished: rankClock(r, now.Add(-62*time.Second))}}
		}
		fold(t, s, now, rep)
	}
	return s
}

func TestStallText(t *testing.T) {
	tests := []struct {
		name  string
		state func(t *testing.T) *State
		warn  time.Duration
		limit int
		want  string
	}{
		{"nothing past the warning", stallJob, 2 * time.Minute, 8, ""},
		{"one rank past it", stallJob, 60 * time.Second, 8,
			`rank 2 on node2 is still in allreduce "grad.fc1" (submitted 61 s ago, negotiated, waiting on rank 5's data)` + "\n" +
				`    last ops: allreduce "grad.fc2" (done 62 s ago)` + "\n" +
				`rank 5 on node3 last finished "grad.fc2" 64 s ago and has submitted nothing since` + "\n" +
				`    last ops: allreduce "grad.fc2" (done 64 s ago)` + "\n"},
		{"the issue's example", stallJob, 30 * time.Second, 8,
			`ranks 0-4 are still in allreduce "grad.fc1" (submitted 61 s ago, negotiated, waiting on rank 5's data)` + "\n" +
				`rank 5 on node3 last finished "grad.fc2" 64 s ago and has submitted nothing since` + "\n" +
				`    last ops: allreduce "grad.fc2" (done 64 s ago)` + "\n"},
		{"not negotiated: waiting for a submission", func(t *testing.T) *State {
			s := New(3)
			for r := range 3 {
				rep := steady(r, 1, now)
				if r != 1 {
					rep.Current = &report.Op{Name: "w", Kind: "broadcast", State: flight.Submitted, Submitted: rankClock(r, now.Add(-90*time.Second))}
				}
				if r == 0 {
					rep.Straggle = &report.Straggle{Slowest: -1, Stalled: []report.Stalled{{Name: "w", Since: now.Add(-90 * time.Second), Arrived: 2, Missing: []int{1}, MissingCount: 1}}}
				}
				if r == 1 {
					rep.Current = &report.Op{Name: "v", Kind: "allgather", State: flight.Started, Submitted: rankClock(r, now.Add(-5*time.Second))}
				}
				fold(t, s, now, rep)
			}
			return s
		}, time.Minute, 8,
			`ranks 0, 2 are still in broadcast "w" (submitted 90 s ago, not negotiated: waiting for rank 1 to submit it)` + "\n" +
				`rank 1 on node1 is in allgather "v" (submitted 5.0 s ago, started)` + "\n"},
		{"limits", func(t *testing.T) *State {
			s := New(4)
			for r := range 4 {
				rep := steady(r, 1, now)
				rep.Current = &report.Op{Name: fmt.Sprint("op", r), Kind: "allreduce", State: flight.Started, Submitted: rankClock(r, now.Add(-time.Hour))}
				fold(t, s, now, rep)
			}
			return s
		}, time.Minute, 2,
			`rank 0 on node1 is still in allreduce "op0" (submitted 60m00s ago, started, waiting on the data of ranks 1-3)` + "\n" +
				`rank 1 on node1 is still in allreduce "op1" (submitted 60m00s ago, started, waiting on the data of ranks 0, 2-3)` + "\n" +
				"... and 2 more ops with ranks in them\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.state(t).StallText(now, tt.warn, tt.limit)
			if got != tt.want {
				t.Fatalf("got:\n%s\nwant:\n%s", got, tt.want)
			}
		})
	}
}

func TestFlightFile(t *testing.T) {
	s := stallJob(t)
	rec := flight.New(4)
	id := rec.Submit(now, "grad.fc1", "allreduce", "float32", 4096, 0)
	rec.Negotiated(id, now)
	snap := rec.Snapshot()
	f := s.FlightFile(now, "stall", map[int]*flight.Snapshot{2: &snap})
	var buf bytes.Buffer
	if err := f.Write(&buf); err != nil {
		t.Fatal(err)
	}
	var back FlightFile
	if err := json.Unmarshal(buf.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if back.Reason != "stall" || back.Size != 6 || len(back.Ranks) != 6 {
		t.Fatalf("file %+v", back)
	}
	r2, r5 := back.Ranks[2], back.Ranks[5]
	if !r2.Full || r2.Total != 1 || len(r2.Ops) != 1 || r2.Ops[0].State != flight.Negotiated || r2.Ops[0].Bytes != 4096 {
		t.Errorf("rank 2: %+v", r2)
	}
	if r5.Full || r5.Host != "node3" || len(r5.Ops) != 1 || r5.Ops[0].Name != "grad.fc2" || r5.Ops[0].State != flight.Done {
		t.Errorf("rank 5: %+v", r5)
	}
	if r0 := back.Ranks[0]; len(r0.Ops) != 2 || r0.Ops[1].Name != "grad.fc1" {
		t.Errorf("rank 0 (tail then current): %+v", r0)
	}
	if !strings.Contains(buf.String(), `"state": "negotiated"`) {
		t.Errorf("states are not written by name:\n%s", buf.String())
	}
	// The end table's figures travel with each rank's record.
	if fig := back.Ranks[3].Figures; fig == nil || fig.Steps != 1001 || fig.StepMedian != 0.12 || fig.StepP95 != 0.18 ||
		fig.InCollectives != 25 || fig.Up != 100 || fig.BytesReduced != 400_000_000_000 || fig.Lateness != nil {
		t.Errorf("rank 3's figures: %+v", fig)
	}
}

func TestFormat(t *testing.T) {
	for _, tt := range []struct {
		d    time.Duration
		want string
	}{{0, "0.00 ms"}, {350 * time.Microsecond, "0.35 ms"}, {41 * time.Millisecond, "41 ms"}, {2500 * time.Millisecond, "2.5 s"},
		{61 * time.Second, "61 s"}, {725 * time.Second, "12m05s"}, {-2 * time.Millisecond, "-2 ms"}} {
		if got := dur(tt.d); got != tt.want {
			t.Errorf("dur(%v) = %q, want %q", tt.d, got, tt.want)
		}
	}
	for _, tt := range []struct {
		n    uint64
		want string
	}{{0, "0 B"}, {999, "999 B"}, {1500, "1.5 kB"}, {3_200_000_000, "3.2 GB"}, {5e15, "5.0 PB"}} {
		if got := bytesSI(tt.n); got != tt.want {
			t.Errorf("bytesSI(%d) = %q, want %q", tt.n, got, tt.want)
		}
	}
	for _, tt := range []struct {
		ranks []int
		limit int
		want  string
	}{{[]int{5}, 4, "rank 5"}, {[]int{0, 1, 2, 3, 6}, 4, "ranks 0-3, 6"}, {[]int{0, 2, 4, 6, 8}, 2, "ranks 0, 2, ... (5 in all)"}} {
		if got := rankList(tt.ranks, tt.limit); got != tt.want {
			t.Errorf("rankList(%v, %d) = %q, want %q", tt.ranks, tt.limit, got, tt.want)
		}
	}
}

func TestShared(t *testing.T) {
	sh := NewShared(New(2))
	done := make(chan bool)
	go func() {
		for i := range 100 {
			sh.Do(func(s *State) { s.Fold(now, steady(0, uint64(i+1), now)) })
		}
		done <- true
	}()
	for range 100 {
		sh.Do(func(s *State) { s.Status(now, time.Second) })
	}
	<-done
}
