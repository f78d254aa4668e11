package view

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/observe/flight"
	"github.com/kolo-dl/kolo/internal/observe/report"
	"github.com/kolo-dl/kolo/internal/observe/straggle"
)

// TestPipeline runs the whole path the engine and launcher will take, without either: four ranks
// record their ops (flight, Meter), rank 0's coordinator times feed a Tracker, reports travel
// encoded, and the launcher folds them and renders. Rank 3 computes 40 ms longer per op; later
// it stops submitting, and the job stalls.
func TestPipeline(t *testing.T) {
	const n = 4
	start := now.Add(-time.Hour)
	recs := make([]*flight.Recorder, n)
	meters := make([]*report.Meter, n)
	for r := range n {
		recs[r], meters[r] = flight.New(64), report.NewMeter(start)
	}
	tr, err := straggle.New(n, straggle.Config{})
	if err != nil {
		t.Fatal(err)
	}
	clock := start
	runOp := func(name string, ranks []int) {
		ids := make([]flight.ID, n)
		for _, r := range ranks {
			at := clock
			if r == 3 {
				at = at.Add(40 * time.Millisecond)
			}
			ids[r] = recs[r].Submit(at, name, "allreduce", "float32", 1<<20, 0)
			if err := tr.Arrive(at, name, r); err != nil {
				t.Fatal(err)
			}
		}
		if len(ranks) < n {
			return // never negotiated
		}
		clock = clock.Add(41 * time.Millisecond)
		for r := range n {
			recs[r].Negotiated(ids[r], clock)
			recs[r].Started(ids[r], clock)
		}
		clock = clock.Add(5 * time.Millisecond)
		for r := range n {
			recs[r].Finished(ids[r], clock, false)
			meters[r].OpDone("allreduce", 5*time.Millisecond, false)
			meters[r].Collective(5*time.Millisecond, 1<<20)
		}
	}
	all := []int{0, 1, 2, 3}
	for range 30 {
		for op := range 3 {
			runOp(fmt.Sprint("grad.fc", op), all)
		}
		clock = clock.Add(10 * time.Millisecond)
		for r := range n {
			meters[r].Step(clock)
		}
		tr.EndStep()
	}

	v := New(n)
	seq := uint64(0)
	publish := func(launcherNow time.Time) {
		seq++
		for r := range n {
			rep := report.Report{Rank: r, Host: fmt.Sprint("node", r/2+1), Seq: seq}
			meters[r].Fill(&rep, clock, recs[r].Snapshot())
			if r == 0 {
				rep.Straggle = report.StraggleOf(tr, clock, 60*time.Second)
			}
			back, err := report.Decode(report.Encode(nil, &rep))
			if err != nil {
				t.Fatal(err)
			}
			if err := v.Fold(launcherNow, back); err != nil {
				t.Fatal(err)
			}
		}
	}
	publish(now)
	status := strings.Join(v.Status(now, 10*time.Second), "\n")
	wantStatus := "kolo: step 30 · 148 ms/step (p95 148 ms) · 4 ranks on 2 hosts · 377.5 MB reduced\n" +
		"slowest: rank 3 on node2 arrives last in 100% of steps, 40 ms after the median of the others"
	if status != wantStatus {
		t.Fatalf("status:\n%s\nwant:\n%s", status, wantStatus)
	}

	// Rank 3 stops submitting; the others submit grad.fc0 and wait. 61 s later:
	runOp("grad.fc0", []int{0, 1, 2})
	clock = clock.Add(61 * time.Second)
	later := now.Add(61 * time.Second)
	publish(later)
	stall := v.StallText(later, 60*time.Second, 8)
	wantStall := `ranks 0-2 are still in allreduce "grad.fc0" (submitted 61 s ago, not negotiated: waiting for rank 3 to submit it)` + "\n" +
		`rank 3 on node2 last finished "grad.fc2" 61 s ago and has submitted nothing since` + "\n" +
		`    last ops: allreduce "grad.fc0" (done 61 s ago), allreduce "grad.fc1" (done 61 s ago), allreduce "grad.fc2" (done 61 s ago)` + "\n"
	if stall != wantStall {
		t.Fatalf("stall text:\n%s\nwant:\n%s", stall, wantStall)
	}
	if got := v.Status(later, 10*time.Second)[2]; got != `stalled: "grad.fc0" for 61 s, waiting on rank 3 (3 of 4 ranks submitted it)` {
		t.Fatalf("status stall line %q", got)
	}
	table := v.EndTable()
	if !strings.Contains(table, "|    3 | node2 |    30 |      148 ms |   148 ms |    40 ms |") {
		t.Fatalf("end table:\n%s", table)
	}
}
