package relay

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/observe/flight"
	"github.com/kolo-dl/kolo/internal/observe/report"
	"github.com/kolo-dl/kolo/internal/observe/view"
	"github.com/kolo-dl/kolo/internal/rendezvous"
)

var now = time.Date(2026, 11, 28, 10, 0, 0, 0, time.UTC)

func publishers(n int) []*Publisher {
	ps := make([]*Publisher, n)
	for r := range n {
		ps[r] = &Publisher{World: "w1", Rank: r, Host: "node1", Recorder: flight.New(8), Meter: report.NewMeter(now)}
	}
	ps[0].Straggle = func() *report.Straggle { return &report.Straggle{Unit: "steps", Slowest: -1} }
	return ps
}

func TestRoundTrip(t *testing.T) {
	ctx := context.Background()
	st := Local{rendezvous.NewStore()}
	ps := publishers(3)
	id := ps[2].Recorder.Submit(now, "grad.fc1", "allreduce", "float32", 64, 0)
	ps[2].Recorder.Negotiated(id, now)
	ps[1].Meter.Step(now.Add(time.Second))
	for _, p := range ps[:2] { // rank 2 has not reported yet
		if err := p.Publish(ctx, st, now); err != nil {
			t.Fatal(err)
		}
	}
	v := view.NewShared(view.New(3))
	if err := Collect(ctx, st, "w1", 3, now, v); err != nil {
		t.Fatal(err)
	}
	v.Do(func(s *view.State) {
		if r, _ := s.Report(1); r == nil || r.Steps != 1 || r.Seq != 1 {
			t.Fatalf("rank 1: %+v", r)
		}
		if r, _ := s.Report(2); r != nil {
			t.Fatalf("rank 2 reported: %+v", r)
		}
		if s.Straggle() == nil {
			t.Fatal("rank 0's straggle figures were lost")
		}
	})

	// No request yet: no flight recorders.
	if f, err := Flights(ctx, st, "w1", 3); err != nil || len(f) != 0 {
		t.Fatalf("flights before a request: %v, %v", f, err)
	}
	if err := RequestFlights(ctx, st, "w1"); err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if err := p.Publish(ctx, st, now.Add(time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	f, err := Flights(ctx, st, "w1", 3)
	if err != nil || len(f) != 3 || len(f[2].Ops) != 1 || f[2].Ops[0].State != flight.Negotiated || f[2].Ops[0].Name != "grad.fc1" {
		t.Fatalf("flights: %+v, %v", f, err)
	}
	// A request is answered once: the next report does not resend the recorder.
	id = ps[2].Recorder.Submit(now, "grad.fc2", "allreduce", "float32", 64, 0)
	ps[2].Publish(ctx, st, now.Add(2*time.Second))
	if f, _ := Flights(ctx, st, "w1", 3); len(f[2].Ops) != 1 {
		t.Fatalf("recorder resent without a request: %+v", f[2])
	}
	if err := Collect(ctx, st, "w1", 3, now.Add(2*time.Second), v); err != nil {
		t.Fatal(err)
	}
	v.Do(func(s *view.State) {
		if r, _ := s.Report(2); r == nil || r.Seq != 2 || r.Open != 2 {
			t.Fatalf("rank 2: %+v", r)
		}
	})
}

func TestCollectBadReport(t *testing.T) {
	ctx := context.Background()
	st := Local{rendezvous.NewStore()}
	ps := publishers(3)
	for _, p := range ps {
		p.Publish(ctx, st, now)
	}
	st.Set(ctx, report.Key("w1", 1), []byte{9, 9, 9})
	r0 := report.Report{Rank: 0}
	st.Set(ctx, report.Key("w1", 2), report.Encode(nil, &r0)) // under the wrong key
	st.Set(ctx, report.FlightKey("w1", 1), []byte("{not json"))
	v := view.NewShared(view.New(3))
	err := Collect(ctx, st, "w1", 3, now, v)
	if !errors.Is(err, report.ErrMalformed) || !strings.Contains(err.Error(), "rank 1") {
		t.Fatalf("Collect = %v, want rank 1's report malformed", err)
	}
	v.Do(func(s *view.State) {
		if r, _ := s.Report(0); r == nil {
			t.Fatal("the good report was dropped")
		}
		if r, _ := s.Report(2); r != nil {
			t.Fatal("a report under another rank's key was folded")
		}
	})
	if _, err := Flights(ctx, st, "w1", 3); err == nil || !strings.Contains(err.Error(), "rank 1") {
		t.Fatalf("Flights = %v, want rank 1's record named", err)
	}
	// A dump request that is not a counter is an error, not a silent skip.
	st.Set(ctx, report.DumpKey("w1"), []byte("x"))
	if err := ps[0].Publish(ctx, st, now); err == nil {
		t.Fatal("a malformed request was accepted")
	}
}

func TestClosedStore(t *testing.T) {
	ctx := context.Background()
	s := rendezvous.NewStore()
	s.Close()
	st := Local{s}
	if err := publishers(1)[0].Publish(ctx, st, now); !errors.Is(err, rendezvous.ErrClosed) {
		t.Fatalf("Publish = %v", err)
	}
	if err := Collect(ctx, st, "w1", 1, now, view.NewShared(view.New(1))); !errors.Is(err, rendezvous.ErrClosed) {
		t.Fatalf("Collect = %v", err)
	}
	if err := RequestFlights(ctx, st, "w1"); !errors.Is(err, rendezvous.ErrClosed) {
		t.Fatalf("RequestFlights = %v", err)
	}
}

// A failure record published by rank is read back by rank, and a malformed one is named.
func TestFailures(t *testing.T) {
	ctx := context.Background()
	st := Local{rendezvous.NewStore()}
	f := report.Failure{Rank: 2, Host: "h", Kind: report.KindLost, Blames: 0, Message: "rank 0 lost"}
	if err := PublishFailure(ctx, st, "w1", report.RankName(2), f); err != nil {
		t.Fatal(err)
	}
	st.Set(ctx, report.FailureKey("w1", "1"), []byte("{"))
	got, err := Failures(ctx, st, "w1", 3)
	if len(got) != 1 || got[2] != f {
		t.Errorf("Failures = %+v, want rank 2's record only", got)
	}
	if !errors.Is(err, report.ErrMalformed) || !strings.Contains(err.Error(), "1's failure record") {
		t.Errorf("Failures error %v, want rank 1's record named malformed", err)
	}
	if _, ok, err := Failure(ctx, st, "w1", "host[0]"); ok || err != nil {
		t.Errorf("a place that sent nothing: ok %v, err %v", ok, err)
	}
}

// BenchmarkPublish is one rank's report (its recorder full) through a real rendezvous over
// loopback, as the rank's reporter sends it every report.Interval: the time per op bounds what the
// reports take from training (at 4 a second, 100 µs a report is 0.04% of a core).
func BenchmarkPublish(b *testing.B) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	srv := rendezvous.NewServer(secret)
	addr, err := srv.Listen("127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Close()
	c, err := rendezvous.Dial(context.Background(), addr.String(), secret)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	p := publishers(2)[1]
	p.Recorder = flight.New(64)
	for i := range 64 {
		id := p.Recorder.Submit(now, fmt.Sprintf("grad.layer%d.weight", i), "allreduce", "float32", 1<<20, 0)
		p.Recorder.Negotiated(id, now)
		p.Recorder.Started(id, now)
		p.Recorder.Finished(id, now, false)
		p.Meter.Step(now)
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if err := p.Publish(context.Background(), c, now.Add(time.Duration(i)*time.Millisecond)); err != nil {
			b.Fatal(err)
		}
	}
}
