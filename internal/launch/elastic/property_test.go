package elastic

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// checkReset checks a Reset decision against what every generation must be, whatever led to it:
// dense ranks within the limits, survivors first in their old order on their old slots, Start
// and Lost exactly the difference with the previous world, and local and cross ranks as the naive
// reference computes them.
func checkReset(prev *Generation, d Decision, cfg Config, hosts []Host) error {
	g := d.World
	if g == nil {
		return errors.New("reset without a world")
	}
	wantNumber, minSize := 1, cfg.NP
	if prev != nil {
		wantNumber, minSize = prev.Number+1, cfg.MinNP
	}
	if g.Number != wantNumber {
		return fmt.Errorf("generation %d after %d", g.Number, wantNumber-1)
	}
	if n := len(g.Ranks); n < minSize || n > cfg.MaxNP {
		return fmt.Errorf("%d ranks, outside %d..%d", n, minSize, cfg.MaxNP)
	}
	slots := map[string]int{}
	for _, h := range hosts {
		slots[h.Name] = h.Slots
	}
	seen := map[Worker]bool{}
	for i, r := range g.Ranks {
		if r.Rank != i || r.Size != len(g.Ranks) {
			return fmt.Errorf("rank %d of %d at index %d of %d", r.Rank, r.Size, i, len(g.Ranks))
		}
		if seen[r.Worker] {
			return fmt.Errorf("%s twice", r.Worker)
		}
		seen[r.Worker] = true
		if r.Slot < 0 || r.Slot >= slots[r.Host] {
			return fmt.Errorf("%s outside the %d listed slots of its host", r.Worker, slots[r.Host])
		}
	}

	// A worker is identified by host and slot, and a reset may both lose a worker and start a
	// new process in its place (a host back from its cooldown), so survivors are the previous
	// world's workers in the new one that Lost does not name.
	var old []Worker
	if prev != nil {
		old = prev.Workers()
	}
	lostSet := map[Worker]bool{}
	var gotLost []Worker
	for _, l := range d.Lost {
		lostSet[l.Worker] = true
		gotLost = append(gotLost, l.Worker)
	}
	var wantLost []Worker
	for _, w := range old {
		if lostSet[w] || !seen[w] {
			wantLost = append(wantLost, w)
		}
	}
	if !slices.Equal(gotLost, wantLost) {
		return fmt.Errorf("Lost %v, want %v (every worker of %v that is not in %v, in order)", gotLost, wantLost, old, g.Workers())
	}
	var survivors, start []Worker
	for _, w := range g.Workers() {
		if slices.Contains(old, w) && !lostSet[w] {
			survivors = append(survivors, w)
		} else {
			start = append(start, w)
		}
	}
	if !slices.Equal(g.Workers()[:len(survivors)], survivors) {
		return fmt.Errorf("survivors %v are not ranks 0..%d of %v", survivors, len(survivors)-1, g.Workers())
	}
	var kept []Worker
	for _, w := range old {
		if slices.Contains(survivors, w) {
			kept = append(kept, w)
		}
	}
	if !slices.Equal(survivors, kept) {
		return fmt.Errorf("survivors %v changed their order from %v", survivors, kept)
	}
	if prev != nil && len(survivors) == 0 {
		return errors.New("a reset with no survivor to broadcast the state from")
	}
	if !slices.Equal(d.Start, start) {
		return fmt.Errorf("Start %v, want %v", d.Start, start)
	}

	for _, r := range g.Ranks {
		want := referenceRank(g.Workers(), r.Rank)
		if r != want {
			return fmt.Errorf("rank %d is %+v, the reference says %+v", r.Rank, r, want)
		}
		if r.LocalRank != r.Slot {
			return fmt.Errorf("%s has local rank %d: slots of a host are not 0..n-1", r.Worker, r.LocalRank)
		}
	}
	return nil
}

// TestRandomEvents drives planners with random discoveries, failures and ticks and checks every
// decision: resets with checkReset, waits and failures against the clock and the limits.
func TestRandomEvents(t *testing.T) {
	names := []string{"localhost", "127.0.0.1", "a", "b", "c", "d"}
	for seed := uint64(0); seed < 300; seed++ {
		rng := rand.New(rand.NewPCG(seed, 7))
		cfg := Config{
			MinNP:      1 + rng.IntN(4),
			Timeout:    time.Duration(1+rng.IntN(100)) * time.Second,
			ResetLimit: rng.IntN(12) - 1,
			Jitter:     rng.Float64,
		}
		cfg.NP = cfg.MinNP + rng.IntN(3)
		cfg.MaxNP = cfg.NP + rng.IntN(6)
		if rng.IntN(2) == 0 {
			cfg.Cooldown = Cooldown{Min: 5 * time.Second, Max: 60 * time.Second}
		}
		p, err := NewPlanner(cfg)
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		now := epoch
		var hosts []Host
		var deadline time.Time
		failedAt := -1
		for step := 0; step < 60; step++ {
			prev, resets := p.World(), p.Resets()
			var d Decision
			var event string
			switch k := rng.IntN(10); {
			case k < 4:
				hosts = nil
				for _, i := range rng.Perm(len(names))[:rng.IntN(len(names)+1)] {
					hosts = append(hosts, Host{Name: names[i], Slots: 1 + rng.IntN(4)})
				}
				event = fmt.Sprintf("discover %v", hosts)
				d = p.Discovered(now, hosts)
			case k < 6 && prev != nil:
				ws := prev.Workers()
				var failing []Worker
				for _, i := range rng.Perm(len(ws))[:1+rng.IntN(len(ws))] {
					failing = append(failing, ws[i])
				}
				event = fmt.Sprintf("fail %v", failing)
				d = p.Failed(now, failing...)
			default:
				now = now.Add(time.Duration(rng.IntN(30)) * time.Second)
				event = "tick"
				d = p.Tick(now)
			}
			where := fmt.Sprintf("seed %d step %d (%s)", seed, step, event)

			if failedAt >= 0 {
				if d.Action != Fail {
					t.Fatalf("%s: %v after the job failed", where, d)
				}
				continue
			}
			switch d.Action {
			case Reset:
				if err := checkReset(prev, d, p.Config(), hosts); err != nil {
					t.Fatalf("%s: %v\n%v", where, err, d)
				}
				if prev != nil && p.Resets() != resets+1 {
					t.Fatalf("%s: reset counted %d -> %d", where, resets, p.Resets())
				}
				if cfg.ResetLimit >= 0 && p.Resets() > cfg.ResetLimit {
					t.Fatalf("%s: %d resets past --reset-limit %d", where, p.Resets(), cfg.ResetLimit)
				}
				deadline = time.Time{}
			case Wait:
				if !deadline.IsZero() && !d.Deadline.Equal(deadline) {
					t.Fatalf("%s: deadline moved from %v to %v", where, deadline, d.Deadline)
				}
				deadline = d.Deadline
				if !now.Before(deadline) {
					t.Fatalf("%s: still waiting at the deadline", where)
				}
			case Fail:
				failedAt = step
				if (errors.Is(d.Err, ErrBelowMinNP) || errors.Is(d.Err, ErrBelowNP) || errors.Is(d.Err, ErrNoSurvivor)) &&
					(deadline.IsZero() || now.Before(deadline)) {
					t.Fatalf("%s: timed out before the deadline %v: %v", where, deadline, d)
				}
			case Nothing:
				deadline = time.Time{}
				if p.World() != prev {
					t.Fatalf("%s: the world changed on a nothing decision", where)
				}
			}
		}
	}
}
