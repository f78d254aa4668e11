// Package relay moves the observe records through the job's rendezvous store: a rank's Publisher
// puts its encoded report (and, when asked, its whole flight recorder) under its keys, and a rank
// that fails its failure record (PublishFailure); the launcher's Collect reads every rank's latest
// report into the view, asks for the flight recorders (RequestFlights) and reads them (Flights),
// and reads the failure records (Failure, Failures).
//
// Each call is one round of store requests; the caller owns the clock and the goroutine (the rank
// calls Publish every report.Interval, the launcher calls Collect a few times a second), so the
// package starts nothing and holds no timer. It must not interpret what it carries beyond
// decoding it, and must not wait on the store (a missing key is "nothing yet", never a wait): a
// rank's reporting must never hold up its training.
package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/kolo-dl/kolo/internal/observe/flight"
	"github.com/kolo-dl/kolo/internal/observe/report"
	"github.com/kolo-dl/kolo/internal/observe/view"
	"github.com/kolo-dl/kolo/internal/rendezvous"
)

// Store is what the relay needs of the rendezvous: rendezvous.Client has it, and Local adapts the
// launcher's in-process rendezvous.Store.
type Store interface {
	Set(ctx context.Context, key string, value []byte) error
	TryGet(ctx context.Context, key string) (value []byte, ok bool, err error)
	Add(ctx context.Context, key string, delta int64) (int64, error)
}

var _ Store = (*rendezvous.Client)(nil)

// Local is a Store over the launcher's own rendezvous.Store.
type Local struct{ S *rendezvous.Store }

func (l Local) Set(_ context.Context, key string, value []byte) error { return l.S.Set(key, value) }
func (l Local) TryGet(_ context.Context, key string) ([]byte, bool, error) {
	return l.S.TryGet(key)
}
func (l Local) Add(_ context.Context, key string, delta int64) (int64, error) {
	return l.S.Add(key, delta)
}

// Publisher is one rank's side. Publish is not safe for concurrent use (one reporter calls it);
// the recorder and meter it reads are.
type Publisher struct {
	World    string // the world's id (report.Key)
	Rank     int
	Host     string
	Recorder *flight.Recorder
	Meter    *report.Meter
	// Straggle, on rank 0 of the global set, returns the latest straggler figures (the engine
	// takes them from its Tracker on its own loop); nil on other ranks.
	Straggle func() *report.Straggle

	seq    uint64
	dumped int64 // the last DumpKey value answered
	rep    report.Report
	buf    []byte
}

// Publish sends one report made at now and, if the launcher asked for flight recorders since the
// last call, the whole recorder too.
func (p *Publisher) Publish(ctx context.Context, s Store, now time.Time) error {
	snap := p.Recorder.Snapshot()
	p.seq++
	p.rep.Rank, p.rep.Host, p.rep.Seq = p.Rank, p.Host, p.seq
	p.Meter.Fill(&p.rep, now, snap)
	p.rep.Straggle = nil
	if p.Straggle != nil {
		p.rep.Straggle = p.Straggle()
	}
	p.buf = report.Encode(p.buf[:0], &p.rep)
	if err := s.Set(ctx, report.Key(p.World, p.Rank), p.buf); err != nil {
		return fmt.Errorf("rank %d: publish report: %w", p.Rank, err)
	}
	v, ok, err := s.TryGet(ctx, report.DumpKey(p.World))
	if err != nil {
		return fmt.Errorf("rank %d: read flight-recorder requests: %w", p.Rank, err)
	}
	if !ok {
		return nil
	}
	n, err := strconv.ParseInt(string(v), 10, 64)
	if err != nil {
		return fmt.Errorf("rank %d: flight-recorder request %q: %w", p.Rank, v, err)
	}
	if n <= p.dumped {
		return nil
	}
	if err := p.PublishFlight(ctx, s, snap); err != nil {
		return err
	}
	p.dumped = n
	return nil
}

// PublishFlight sends the whole flight recorder snap: on the launcher's request, or by the rank
// itself when its own stall warning fires or its engine fails.
func (p *Publisher) PublishFlight(ctx context.Context, s Store, snap flight.Snapshot) error {
	b, err := json.Marshal(snap)
	if err != nil {
		return fmt.Errorf("rank %d: encode flight recorder: %w", p.Rank, err)
	}
	if err := s.Set(ctx, report.FlightKey(p.World, p.Rank), b); err != nil {
		return fmt.Errorf("rank %d: publish flight recorder: %w", p.Rank, err)
	}
	return nil
}

// Collect reads the latest report of each of size ranks of world and folds it into v at now (the
// launcher's clock). A rank with no report yet is skipped; a report that does not decode is an
// error naming the rank, after the others are folded.
func Collect(ctx context.Context, s Store, world string, size int, now time.Time, v *view.Shared) error {
	var bad error
	reports := make([]report.Report, 0, size)
	for r := range size {
		b, ok, err := s.TryGet(ctx, report.Key(world, r))
		if err != nil {
			return fmt.Errorf("collect reports: %w", err)
		}
		if !ok {
			continue
		}
		rep, err := report.Decode(b)
		if err == nil && rep.Rank != r {
			err = fmt.Errorf("report under rank %d's key says rank %d", r, rep.Rank)
		}
		if err != nil {
			if bad == nil {
				bad = fmt.Errorf("rank %d's report: %w", r, err)
			}
			continue
		}
		reports = append(reports, rep)
	}
	// Decoding happens outside the view's lock: a scrape or a redraw waits only for the folds.
	v.Do(func(st *view.State) {
		for _, rep := range reports {
			if err := st.Fold(now, rep); err != nil && bad == nil {
				bad = err
			}
		}
	})
	return bad
}

// RequestFlights asks every rank of world for its whole flight recorder; each sends it with its
// next report.
func RequestFlights(ctx context.Context, s Store, world string) error {
	if _, err := s.Add(ctx, report.DumpKey(world), 1); err != nil {
		return fmt.Errorf("request flight recorders: %w", err)
	}
	return nil
}

// Flights reads the flight recorders the ranks of world have sent, by rank; a rank that sent none
// is absent, and so is one whose record does not decode (it is reported in err, after the rest).
func Flights(ctx context.Context, s Store, world string, size int) (map[int]*flight.Snapshot, error) {
	out := map[int]*flight.Snapshot{}
	var bad error
	for r := range size {
		b, ok, err := s.TryGet(ctx, report.FlightKey(world, r))
		if err != nil {
			return out, fmt.Errorf("read flight recorders: %w", err)
		}
		if !ok {
			continue
		}
		var snap flight.Snapshot
		if err := json.Unmarshal(b, &snap); err != nil {
			if bad == nil {
				bad = fmt.Errorf("rank %d's flight recorder: %w", r, err)
			}
			continue
		}
		out[r] = &snap
	}
	return out, bad
}

// PublishFailure sends f, the failure record of the process the launcher knows as who in world
// (report.FailureKey). A later record replaces an earlier one.
func PublishFailure(ctx context.Context, s Store, world, who string, f report.Failure) error {
	if err := s.Set(ctx, report.FailureKey(world, who), report.EncodeFailure(f)); err != nil {
		return fmt.Errorf("rank %d: publish failure record: %w", f.Rank, err)
	}
	return nil
}

// Failure reads the failure record of who in world; ok is false when it sent none.
func Failure(ctx context.Context, s Store, world, who string) (f report.Failure, ok bool, err error) {
	b, ok, err := s.TryGet(ctx, report.FailureKey(world, who))
	if err != nil || !ok {
		return report.Failure{}, false, err
	}
	if f, err = report.DecodeFailure(b); err != nil {
		return report.Failure{}, false, fmt.Errorf("%s's failure record: %w", who, err)
	}
	return f, true, nil
}

// Failures reads the failure records of the ranks of a static job (report.RankName), by rank; a
// rank that sent none is absent, and so is one whose record does not decode (reported in err,
// after the rest).
func Failures(ctx context.Context, s Store, world string, size int) (map[int]report.Failure, error) {
	out := map[int]report.Failure{}
	var bad error
	for r := range size {
		f, ok, err := Failure(ctx, s, world, report.RankName(r))
		switch {
		case err != nil && !errors.Is(err, report.ErrMalformed):
			return out, fmt.Errorf("read failure records: %w", err)
		case err != nil:
			if bad == nil {
				bad = err
			}
		case ok:
			out[r] = f
		}
	}
	return out, bad
}
