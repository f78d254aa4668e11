package worker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/engine"
	"github.com/kolo-dl/kolo/internal/observe/flight"
	"github.com/kolo-dl/kolo/internal/observe/relay"
	"github.com/kolo-dl/kolo/internal/observe/report"
	"github.com/kolo-dl/kolo/internal/observe/view"
	"github.com/kolo-dl/kolo/internal/rendezvous"
	"github.com/kolo-dl/kolo/internal/transport"
)

// countingStore counts the flight recorders set through it.
type countingStore struct {
	relay.Local
	flights atomic.Int32
}

func (c *countingStore) Set(ctx context.Context, key string, value []byte) error {
	if key == report.FlightKey("w", 1) {
		c.flights.Add(1)
	}
	return c.Local.Set(ctx, key, value)
}

// The reporter publishes while the engine runs, sends the failure record and the flight recorder
// once after the engine fails (on its next tick, not again at stop), and a last report at stop.
func TestReporter(t *testing.T) {
	for _, tc := range []struct {
		name        string
		engineFails bool // while the reporter runs
		leaveFailed bool // the shutdown did not complete
		wantFlights int32
		wantKind    report.Kind // "": no failure record
		wantBlames  int
	}{
		{"clean", false, false, 0, "", 0},
		{"engine fails", true, false, 1, report.KindStalled, 7},
		{"shutdown fails", false, true, 1, report.KindError, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := &countingStore{Local: relay.Local{S: rendezvous.NewStore()}}
			rec, meter := flight.New(8), report.NewMeter(time.Now())
			rec.Submit(time.Now(), "grad", "allreduce", "float32", 4, 0)
			var engErr atomic.Pointer[error]
			errf := func() error {
				if p := engErr.Load(); p != nil {
					return *p
				}
				return nil
			}
			pub := relay.Publisher{World: "w", Rank: 1, Host: "h", Recorder: rec, Meter: meter}
			key := failureKey{world: "job", who: "1", rank: 1, host: "h", launcherRank: func(r int) int { return r + 5 }}
			r := newReporter(pub, st, key, 5*time.Millisecond, errf)
			waitFor(t, func() bool {
				v, ok, _ := st.TryGet(context.Background(), report.Key("w", 1))
				return ok && len(v) > 0
			})
			if tc.engineFails {
				var e error = &engine.StuckError{Rank: 2, Reason: "rank 2 (h) made no progress for 1s"}
				engErr.Store(&e)
				waitFor(t, func() bool { return st.flights.Load() == 1 })
			}
			meter.Step(time.Now())
			var leaveErr error
			if tc.leaveFailed {
				leaveErr = errors.New("shutdown: waiting for every rank to reach shutdown: timeout")
			}
			r.stop(leaveErr)
			if got := st.flights.Load(); got != tc.wantFlights {
				t.Errorf("flight recorders sent: %d, want %d", got, tc.wantFlights)
			}
			f, ok, err := relay.Failure(context.Background(), st, "job", "1")
			switch {
			case err != nil:
				t.Fatal(err)
			case ok != (tc.wantKind != ""):
				t.Fatalf("failure record %+v sent: %v, want %v", f, ok, tc.wantKind != "")
			case ok && (f.Kind != tc.wantKind || f.Blames != tc.wantBlames || f.Rank != 1 || f.Host != "h"):
				t.Errorf("failure record %+v, want kind %q blaming rank %d", f, tc.wantKind, tc.wantBlames)
			}
			v := view.NewShared(view.New(2))
			if err := relay.Collect(context.Background(), st, "w", 2, time.Now(), v); err != nil {
				t.Fatal(err)
			}
			v.Do(func(s *view.State) {
				if rep, _ := s.Report(1); rep == nil || rep.Steps != 1 {
					t.Errorf("last report %+v: want the step marked before stop", rep)
				}
			})
		})
	}
}

// Each engine error becomes the record of its kind, blaming the rank it names.
func TestFailureOf(t *testing.T) {
	for _, tc := range []struct {
		name   string
		err    error
		own    bool
		kind   report.Kind
		blames int
	}{
		{"the program's exception", errors.New("ValueError: bad batch"), true, report.KindException, -1},
		{"stuck peer", fmt.Errorf("rank 0: %w", &engine.StuckError{Rank: 3, Reason: "x"}), false, report.KindStalled, 3},
		{"stalled transfer", &transport.StallError{Rank: 2, Op: "recv"}, false, report.KindStalled, 2},
		{"peer's abort notice", &engine.PeerFailedError{Rank: 1, Reason: "rank 1 failed: ValueError"}, false, report.KindPeerFailed, 1},
		{"peer lost in the transport", fmt.Errorf("rank 0: %w", &transport.PeerError{Rank: 2, Op: "recv", Err: io.EOF}), false, report.KindLost, 2},
		{"peer lost in the engine", fmt.Errorf("rank 0: %w", &engine.LostError{Rank: 4, Err: io.EOF}), false, report.KindLost, 4},
		{"this rank's own abort", &engine.AbortError{Err: errors.New("rank 1 failed: bad")}, false, report.KindException, -1},
		{"a peer ended early", &engine.OpError{Msg: "allreduce \"g\": rank 3 ended without submitting it", Op: "g", Ended: []int{3}}, false, report.KindEnded, 3},
		{"op error", &engine.OpError{Msg: "allreduce \"g\": shapes differ", Op: "g"}, false, report.KindOp, -1},
		{"anything else", errors.New("malformed control message"), false, report.KindError, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := failureOf(tc.err, tc.own)
			if f.Kind != tc.kind || f.Blames != tc.blames || f.Message != tc.err.Error() {
				t.Errorf("failureOf = %+v, want kind %q blaming %d", f, tc.kind, tc.blames)
			}
		})
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 10 s")
		}
	}
}

// With reports off (KOLO_REPORTS=0) the reporter publishes nothing, but a failure still sends its
// record.
func TestReporterOff(t *testing.T) {
	st := &countingStore{Local: relay.Local{S: rendezvous.NewStore()}}
	pub := relay.Publisher{World: "w", Rank: 1, Host: "h", Recorder: flight.New(8), Meter: report.NewMeter(time.Now())}
	key := failureKey{world: "job", who: "1", rank: 1, host: "h", launcherRank: func(r int) int { return r }}
	r := newReporter(pub, st, key, 0, func() error { return nil })
	time.Sleep(20 * time.Millisecond)
	r.stop(errors.New("shutdown: timeout"))
	if _, ok, _ := st.TryGet(context.Background(), report.Key("w", 1)); ok {
		t.Error("a report was published with reports off")
	}
	if f, ok, err := relay.Failure(context.Background(), st, "job", "1"); !ok || err != nil || f.Kind != report.KindError {
		t.Errorf("failure record %+v, %v, %v: want the shutdown's", f, ok, err)
	}
}
