package worker

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/observe/flight"
	"github.com/kolo-dl/kolo/observe/relay"
	"github.com/kolo-dl/kolo/observe/report"
	"github.com/kolo-dl/kolo/observe/view"
	"github.com/kolo-dl/kolo/rendezvous"
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

// The reporter publishes while the engine runs, sends the flight recorder once after the engine
// fails (on its next tick, not again at stop), and a last report at stop.
func TestReporter(t *testing.T) {
	for _, tc := range []struct {
		name        string
		engineFails bool // while the reporter runs
		leaveFailed bool // the shutdown did not complete
		wantFlights int32
	}{
		{"clean", false, false, 0},
		{"engine fails", true, false, 1},
		{"shutdown fails", false, true, 1},
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
			r := newReporter(pub, st, 5*time.Millisecond, errf)
			waitFor(t, func() bool {
				v, ok, _ := st.TryGet(context.Background(), report.Key("w", 1))
				return ok && len(v) > 0
			})
			if tc.engineFails {
				e := errors.New("peer lost")
				engErr.Store(&e)
				waitFor(t, func() bool { return st.flights.Load() == 1 })
			}
			meter.Step(time.Now())
			r.stop(tc.leaveFailed)
			if got := st.flights.Load(); got != tc.wantFlights {
				t.Errorf("flight recorders sent: %d, want %d", got, tc.wantFlights)
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

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 10 s")
		}
	}
}
