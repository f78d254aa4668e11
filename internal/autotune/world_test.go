package autotune

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/autotune/csvlog"
)

func TestWorldString(t *testing.T) {
	for _, tc := range []struct {
		w    World
		want string
	}{
		{World{Ranks: 3, Hosts: 2}, "3 ranks on 2 hosts"},
		{World{Round: 2, Ranks: 2, Hosts: 1}, "round 2, 2 ranks on 1 host"},
		{World{Round: 1, Ranks: 1, Hosts: 1}, "round 1, 1 rank on 1 host"},
	} {
		if got := tc.w.String(); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.w, got, tc.want)
		}
	}
}

// TestDecisionFor: rounds of an elastic job append their rows to one log; a decision is read back
// for a world of the same ranks and hosts only, the latest first, and a log written before the
// world columns existed holds for any world.
func TestDecisionFor(t *testing.T) {
	var buf bytes.Buffer
	decideIn := func(w World, cycle time.Duration) {
		t.Helper()
		// A job whose cycle time costs its length: from defaults at a 20 ms cycle, cycle 0 wins.
		cfg := Config{Defaults: Settings{FusionBytes: 1 << 20, CycleTime: cycle}, World: w, Seed: 1}
		lw := &buf
		if buf.Len() > 0 {
			lw = nil // appended rows: written by a tuner whose header goes elsewhere
		}
		var rows bytes.Buffer
		cfg.Log = &rows
		if lw != nil {
			cfg.Log = lw
		}
		r := simulateTo(t, cfg, job{mean: cycleCost(0.05, 1), jitter: 0.02})
		if !r.Done() {
			t.Fatalf("%v: not decided", w)
		}
		if lw == nil {
			// Drop the comment and header lines, as the engine does when it appends.
			b := rows.Bytes()
			for range 2 {
				b = b[bytes.IndexByte(b, '\n')+1:]
			}
			buf.Write(b)
		}
	}
	decideIn(World{Round: 1, Ranks: 3, Hosts: 2}, 20*time.Millisecond)
	decideIn(World{Round: 2, Ranks: 2, Hosts: 1}, 10*time.Millisecond)
	l, err := csvlog.Read(bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatalf("%v\n%s", err, buf.String())
	}
	rounds := map[string]bool{}
	for _, row := range l.Rows {
		rounds[row.Settings[ColumnRound]] = true
	}
	if !rounds["1"] || !rounds["2"] || len(rounds) != 2 {
		t.Errorf("rounds in the log: %v", rounds)
	}
	for _, tc := range []struct {
		w    World
		want World
		err  error
	}{
		{World{Round: 3, Ranks: 3, Hosts: 2}, World{Round: 1, Ranks: 3, Hosts: 2}, nil},
		{World{Round: 3, Ranks: 2, Hosts: 1}, World{Round: 2, Ranks: 2, Hosts: 1}, nil},
		{World{Ranks: 2, Hosts: 2}, World{}, ErrNoDecisionForWorld},
		{World{}, World{Round: 2, Ranks: 2, Hosts: 1}, nil}, // not known: the last decision
	} {
		s, got, err := DecisionFor(l, tc.w)
		if !errors.Is(err, tc.err) || got != tc.want {
			t.Errorf("%v: decision of %v (%v), err %v; want %v, err %v", tc.w, got, s, err, tc.want, tc.err)
		}
		if err == nil && s.CycleTime >= 10*time.Millisecond {
			t.Errorf("%v: read back %v, want a shorter cycle than either round's defaults", tc.w, s)
		}
	}

	// A log of no decision, and one from before the world columns.
	empty, _ := csvlog.Read(strings.NewReader(csvlog.Comment + "\nsample,step,fusion_bytes,cycle_ms,phase,step_time_s,role,speedup,ci_low,ci_high\n"))
	if _, _, err := DecisionFor(empty, World{Ranks: 2}); !errors.Is(err, csvlog.ErrNoDecision) {
		t.Errorf("empty log: %v", err)
	}
	old, err := csvlog.Read(strings.NewReader(csvlog.Comment + "\nsample,step,fusion_bytes,cycle_ms,phase,step_time_s,role,speedup,ci_low,ci_high\n" +
		",113,268435456,0,decided,0.05,chosen,1.38,1.36,1.41\n"))
	if err != nil {
		t.Fatal(err)
	}
	if s, _, err := DecisionFor(old, World{Round: 4, Ranks: 8, Hosts: 2}); err != nil || s != (Settings{FusionBytes: 256 << 20}) {
		t.Errorf("a log without world columns: %v, %v", s, err)
	}
}

// simulateTo runs j under cfg until the tuner decides, logging to cfg.Log.
func simulateTo(t *testing.T, cfg Config, j job) *Tuner {
	t.Helper()
	tu, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(0, 0)
	inForce, pending := cfg.Defaults, map[int64]Settings{}
	for step := int64(1); step <= 1000 && !tu.Done(); step++ {
		if s, ok := pending[step]; ok {
			inForce = s
		}
		now = now.Add(time.Duration(j.mean(inForce, step) * float64(time.Second)))
		if s, from, change := tu.Step(step, now); change {
			pending[from] = s
		}
	}
	if err := tu.Close(); err != nil {
		t.Fatal(err)
	}
	return tu
}
