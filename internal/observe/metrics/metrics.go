// Package metrics serves the launcher's view of a job (package view) as Prometheus metrics, for
// `kolo run --metrics-addr HOST:PORT`: per-rank step time, lateness, time in collectives, bytes
// reduced and ops; op latency histograms per kind; stalls, elastic resets and ranks up.
//
// The Collector reads the view at scrape time (no copy of the figures is kept here, so nothing can
// drift from what the terminal shows) and goes through prometheus/client_golang, the library every
// scraper understands. It must not compute figures of its own beyond unit conversions and sums
// across ranks, and must not be scraped into the job's decisions.
//
// Cardinality: the per-rank series carry rank and host labels, about 9 series per rank (9,000 at
// 1,000 ranks), which one Prometheus holds easily; op latency is summed across ranks per kind. An
// elastic re-form renumbers the ranks and restarts their counters, which Prometheus's rate() reads
// as a counter reset.
package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kolo-dl/kolo/internal/observe/report"
	"github.com/kolo-dl/kolo/internal/observe/view"
)

var (
	rankLabels = []string{"rank", "host"}

	ranks       = prometheus.NewDesc("kolo_ranks", "Ranks in the job's current world.", nil, nil)
	ranksUp     = prometheus.NewDesc("kolo_ranks_up", "Ranks whose last report is recent.", nil, nil)
	stepRate    = prometheus.NewDesc("kolo_steps_per_second", "Steps per second over the last 10 s.", nil, nil)
	stalledOps  = prometheus.NewDesc("kolo_stalled_ops", "Ops some ranks submitted and others have not, past the warning time.", nil, nil)
	stalls      = prometheus.NewDesc("kolo_stalls_total", "Distinct ops reported stalled.", nil, nil)
	resets      = prometheus.NewDesc("kolo_elastic_resets_total", "Elastic re-forms of the job.", nil, nil)
	steps       = prometheus.NewDesc("kolo_rank_steps_total", "Steps the rank took.", rankLabels, nil)
	stepMedian  = prometheus.NewDesc("kolo_rank_step_median_seconds", "Median step time over the rank's last steps.", rankLabels, nil)
	stepP95     = prometheus.NewDesc("kolo_rank_step_p95_seconds", "95th percentile step time over the rank's last steps.", rankLabels, nil)
	lateness    = prometheus.NewDesc("kolo_rank_lateness_seconds", "Median time the rank arrives at an op after the median of the other ranks.", rankLabels, nil)
	collSeconds = prometheus.NewDesc("kolo_rank_collective_seconds_total", "Time the rank spent executing collectives.", rankLabels, nil)
	reduced     = prometheus.NewDesc("kolo_rank_reduced_bytes_total", "Bytes the rank reduced.", rankLabels, nil)
	ops         = prometheus.NewDesc("kolo_rank_ops_total", "Ops the rank finished, by result.", append(rankLabels, "result"), nil)
	opLatency   = prometheus.NewDesc("kolo_op_latency_seconds", "Op latency from submission to completion, summed over the ranks.", []string{"kind"}, nil)
)

// Collector is a prometheus.Collector over a shared view.
type Collector struct {
	view        *view.Shared
	silentAfter time.Duration
	now         func() time.Time
}

// New returns a Collector over v: a rank counts as up while its last report is younger than
// silentAfter by now (time.Now in the launcher).
func New(v *view.Shared, silentAfter time.Duration, now func() time.Time) *Collector {
	return &Collector{view: v, silentAfter: silentAfter, now: now}
}

// Describe sends every metric's description.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{ranks, ranksUp, stepRate, stalledOps, stalls, resets, steps, stepMedian, stepP95, lateness, collSeconds, reduced, ops, opLatency} {
		ch <- d
	}
}

// Collect sends the view's figures as they are now.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	now := c.now()
	c.view.Do(func(s *view.State) {
		up := 0
		type hist struct {
			counts [report.LatencyBounds]uint64
			sum    time.Duration
		}
		kinds := map[string]*hist{}
		var kindOrder []string
		for rank, r := range s.Reports() {
			if r == nil {
				continue
			}
			if _, at := s.Report(rank); now.Sub(at) < c.silentAfter {
				up++
			}
			l := []string{strconv.Itoa(rank), r.Host}
			ch <- prometheus.MustNewConstMetric(steps, prometheus.CounterValue, float64(r.Steps), l...)
			ch <- prometheus.MustNewConstMetric(stepMedian, prometheus.GaugeValue, r.StepMedian.Seconds(), l...)
			ch <- prometheus.MustNewConstMetric(stepP95, prometheus.GaugeValue, r.StepP95.Seconds(), l...)
			if late, ok := s.Lateness(rank); ok {
				ch <- prometheus.MustNewConstMetric(lateness, prometheus.GaugeValue, late.Seconds(), l...)
			}
			ch <- prometheus.MustNewConstMetric(collSeconds, prometheus.CounterValue, r.InCollectives.Seconds(), l...)
			ch <- prometheus.MustNewConstMetric(reduced, prometheus.CounterValue, float64(r.BytesReduced), l...)
			ch <- prometheus.MustNewConstMetric(ops, prometheus.CounterValue, float64(r.OpsDone), append(l, "done")...)
			ch <- prometheus.MustNewConstMetric(ops, prometheus.CounterValue, float64(r.OpsFailed), append(l, "failed")...)
			for _, k := range r.OpLatency {
				h := kinds[k.Kind]
				if h == nil {
					h = &hist{}
					kinds[k.Kind] = h
					kindOrder = append(kindOrder, k.Kind)
				}
				for i, n := range k.Counts {
					h.counts[i] += n
				}
				h.sum += k.Sum
			}
		}
		for _, kind := range kindOrder {
			h := kinds[kind]
			buckets := make(map[float64]uint64, len(report.Buckets))
			var cum uint64
			for i, b := range report.Buckets {
				cum += h.counts[i]
				buckets[b.Seconds()] = cum
			}
			count := cum + h.counts[len(h.counts)-1]
			ch <- prometheus.MustNewConstHistogram(opLatency, count, h.sum.Seconds(), buckets, kind)
		}
		stalled := 0
		if st := s.Straggle(); st != nil {
			stalled = len(st.Stalled)
		}
		ch <- prometheus.MustNewConstMetric(ranks, prometheus.GaugeValue, float64(s.Size()))
		ch <- prometheus.MustNewConstMetric(ranksUp, prometheus.GaugeValue, float64(up))
		ch <- prometheus.MustNewConstMetric(stepRate, prometheus.GaugeValue, s.StepRate(now, view.RateWindow))
		ch <- prometheus.MustNewConstMetric(stalledOps, prometheus.GaugeValue, float64(stalled))
		ch <- prometheus.MustNewConstMetric(stalls, prometheus.CounterValue, float64(s.Stalls()))
		ch <- prometheus.MustNewConstMetric(resets, prometheus.CounterValue, float64(s.Resets()))
	})
}

// Handler serves c (and nothing else: the launcher's own Go runtime is not the job) in the
// Prometheus exposition format.
func Handler(c *Collector) (http.Handler, error) {
	reg := prometheus.NewRegistry()
	if err := reg.Register(c); err != nil {
		return nil, fmt.Errorf("metrics: register collector: %w", err)
	}
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), nil
}

// Serve listens on addr (HOST:PORT; port 0 picks one) and serves c at /metrics until ctx ends.
// ready, if not nil, gets the address it listens on once it does.
func Serve(ctx context.Context, addr string, c *Collector, ready func(net.Addr)) error {
	h, err := Handler(c)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("metrics: listen on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", h)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	if ready != nil {
		ready(ln.Addr())
	}
	ctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		<-ctx.Done()
		shut, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(shut)
	}()
	err = srv.Serve(ln)
	stop() // if Serve failed on its own, the goroutine still waits
	<-done
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return fmt.Errorf("metrics: serve on %s: %w", addr, err)
}
