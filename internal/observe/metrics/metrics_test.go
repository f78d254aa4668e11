package metrics

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kolo-dl/kolo/internal/observe/report"
	"github.com/kolo-dl/kolo/internal/observe/view"
)

var now = time.Date(2026, 11, 28, 10, 0, 0, 0, time.UTC)

// job is a 3-rank world after one elastic reset: rank 0 reports now, rank 1 a minute ago (silent),
// rank 2 never; rank 0 names rank 1 the slowest and one op stalled.
func job(t *testing.T) *view.Shared {
	s := view.New(3)
	foldAll := func() {
		for r := range 2 {
			at := now
			if r == 1 {
				at = now.Add(-time.Minute)
			}
			rep := report.Report{Rank: r, Host: "node1", Seq: 1, At: at, Up: 100 * time.Second, Steps: 100,
				StepMedian: 250 * time.Millisecond, StepP95: 500 * time.Millisecond, InCollectives: 30 * time.Second,
				BytesReduced: 1 << 30, OpsDone: 1000, OpsFailed: 1,
				OpLatency: []report.KindLatency{{Kind: "allreduce", Counts: [report.LatencyBounds]uint64{1, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 1}, Sum: 20 * time.Second}}}
			if r == 0 {
				rep.Straggle = &report.Straggle{Unit: "steps", Samples: 20, Slowest: 1,
					Ranks:   []report.Late{{Rank: 1, Last: 19, Lateness: 40 * time.Millisecond}},
					Stalled: []report.Stalled{{Name: "g", Since: now, Arrived: 1, Missing: []int{2}, MissingCount: 1}}}
			}
			if err := s.Fold(at, rep); err != nil {
				t.Fatal(err)
			}
		}
	}
	foldAll()
	s.Reset(3) // counts a reset and forgets the ranks: the same stall seen again counts once
	foldAll()
	return view.NewShared(s)
}

func collector(t *testing.T) *Collector {
	return New(job(t), 10*time.Second, func() time.Time { return now })
}

func TestCollect(t *testing.T) {
	tests := []struct {
		name    string
		metrics []string
		want    string
	}{
		{"job", []string{"kolo_ranks", "kolo_ranks_up", "kolo_stalled_ops", "kolo_stalls_total", "kolo_elastic_resets_total", "kolo_steps_per_second"}, `
# HELP kolo_elastic_resets_total Elastic re-forms of the job.
# TYPE kolo_elastic_resets_total counter
kolo_elastic_resets_total 1
# HELP kolo_ranks Ranks in the job's current world.
# TYPE kolo_ranks gauge
kolo_ranks 3
# HELP kolo_ranks_up Ranks whose last report is recent.
# TYPE kolo_ranks_up gauge
kolo_ranks_up 1
# HELP kolo_stalled_ops Ops some ranks submitted and others have not, past the warning time.
# TYPE kolo_stalled_ops gauge
kolo_stalled_ops 1
# HELP kolo_stalls_total Distinct ops reported stalled.
# TYPE kolo_stalls_total counter
kolo_stalls_total 1
# HELP kolo_steps_per_second Steps per second over the last 10 s.
# TYPE kolo_steps_per_second gauge
kolo_steps_per_second 0
`},
		{"per rank", []string{"kolo_rank_steps_total", "kolo_rank_lateness_seconds", "kolo_rank_step_median_seconds", "kolo_rank_ops_total", "kolo_rank_reduced_bytes_total", "kolo_rank_collective_seconds_total"}, `
# HELP kolo_rank_collective_seconds_total Time the rank spent executing collectives.
# TYPE kolo_rank_collective_seconds_total counter
kolo_rank_collective_seconds_total{host="node1",rank="0"} 30
kolo_rank_collective_seconds_total{host="node1",rank="1"} 30
# HELP kolo_rank_lateness_seconds Median time the rank arrives at an op after the median of the other ranks.
# TYPE kolo_rank_lateness_seconds gauge
kolo_rank_lateness_seconds{host="node1",rank="1"} 0.04
# HELP kolo_rank_ops_total Ops the rank finished, by result.
# TYPE kolo_rank_ops_total counter
kolo_rank_ops_total{host="node1",rank="0",result="done"} 1000
kolo_rank_ops_total{host="node1",rank="0",result="failed"} 1
kolo_rank_ops_total{host="node1",rank="1",result="done"} 1000
kolo_rank_ops_total{host="node1",rank="1",result="failed"} 1
# HELP kolo_rank_reduced_bytes_total Bytes the rank reduced.
# TYPE kolo_rank_reduced_bytes_total counter
kolo_rank_reduced_bytes_total{host="node1",rank="0"} 1.073741824e+09
kolo_rank_reduced_bytes_total{host="node1",rank="1"} 1.073741824e+09
# HELP kolo_rank_step_median_seconds Median step time over the rank's last steps.
# TYPE kolo_rank_step_median_seconds gauge
kolo_rank_step_median_seconds{host="node1",rank="0"} 0.25
kolo_rank_step_median_seconds{host="node1",rank="1"} 0.25
# HELP kolo_rank_steps_total Steps the rank took.
# TYPE kolo_rank_steps_total counter
kolo_rank_steps_total{host="node1",rank="0"} 100
kolo_rank_steps_total{host="node1",rank="1"} 100
`},
		{"op latency summed over ranks", []string{"kolo_op_latency_seconds"}, `
# HELP kolo_op_latency_seconds Op latency from submission to completion, summed over the ranks.
# TYPE kolo_op_latency_seconds histogram
kolo_op_latency_seconds_bucket{kind="allreduce",le="0.0001"} 2
kolo_op_latency_seconds_bucket{kind="allreduce",le="0.0003"} 2
kolo_op_latency_seconds_bucket{kind="allreduce",le="0.001"} 6
kolo_op_latency_seconds_bucket{kind="allreduce",le="0.003"} 6
kolo_op_latency_seconds_bucket{kind="allreduce",le="0.01"} 6
kolo_op_latency_seconds_bucket{kind="allreduce",le="0.03"} 6
kolo_op_latency_seconds_bucket{kind="allreduce",le="0.1"} 6
kolo_op_latency_seconds_bucket{kind="allreduce",le="0.3"} 6
kolo_op_latency_seconds_bucket{kind="allreduce",le="1"} 6
kolo_op_latency_seconds_bucket{kind="allreduce",le="3"} 6
kolo_op_latency_seconds_bucket{kind="allreduce",le="10"} 6
kolo_op_latency_seconds_bucket{kind="allreduce",le="+Inf"} 8
kolo_op_latency_seconds_sum{kind="allreduce"} 40
kolo_op_latency_seconds_count{kind="allreduce"} 8
`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := testutil.CollectAndCompare(collector(t), strings.NewReader(tt.want), tt.metrics...); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestLint(t *testing.T) {
	problems, err := testutil.CollectAndLint(collector(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
}

func TestServe(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	addrs := make(chan net.Addr, 1)
	errc := make(chan error, 1)
	go func() { errc <- Serve(ctx, "127.0.0.1:0", collector(t), func(a net.Addr) { addrs <- a }) }()
	var addr net.Addr
	select {
	case addr = <-addrs:
	case err := <-errc:
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + addr.String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `kolo_rank_steps_total{host="node1",rank="0"} 100`) {
		t.Fatalf("scrape:\n%s", body)
	}
	cancel()
	if err := <-errc; err != nil {
		t.Fatalf("Serve after cancel: %v", err)
	}
	if err := Serve(context.Background(), "256.0.0.1:1", collector(t), nil); err == nil {
		t.Fatal("listening on a bad address succeeded")
	}
}
