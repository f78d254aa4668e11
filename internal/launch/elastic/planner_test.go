package elastic

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestNewPlannerConfig(t *testing.T) {
	jitter := func() float64 { return 0 }
	tests := []struct {
		name string
		cfg  Config
		want Config // NP, MinNP, MaxNP, Timeout after defaults
		err  string
	}{
		{name: "np alone is the minimum, and no maximum, as in Horovod", cfg: Config{NP: 4}, want: Config{NP: 4, MinNP: 4, MaxNP: 0, Timeout: DefaultTimeout}},
		{name: "min-np alone starts at it", cfg: Config{MinNP: 2, MaxNP: 8}, want: Config{NP: 2, MinNP: 2, MaxNP: 8, Timeout: DefaultTimeout}},
		{name: "all given", cfg: Config{NP: 4, MinNP: 2, MaxNP: 8, Timeout: time.Minute}, want: Config{NP: 4, MinNP: 2, MaxNP: 8, Timeout: time.Minute}},
		{name: "nothing given", cfg: Config{}, err: "-np or --min-np must be at least 1"},
		{name: "max below min", cfg: Config{NP: 4, MinNP: 4, MaxNP: 2}, err: "--max-np 2 is below --min-np 4"},
		{name: "np below min", cfg: Config{NP: 1, MinNP: 2, MaxNP: 4}, err: "-np 1 is outside --min-np 2 .. --max-np 4"},
		{name: "np above max", cfg: Config{NP: 5, MinNP: 2, MaxNP: 4}, err: "-np 5 is outside"},
		{name: "negative timeout", cfg: Config{NP: 1, Timeout: -time.Second}, err: "negative timeout"},
		{name: "bad cooldown range", cfg: Config{NP: 1, Cooldown: Cooldown{time.Minute, time.Second}, Jitter: jitter}, err: "want 0 < MIN <= MAX"},
		{name: "cooldown without jitter", cfg: Config{NP: 1, Cooldown: Cooldown{time.Second, time.Minute}}, err: "needs a jitter source"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := NewPlanner(tc.cfg)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %v; want an error containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := p.Config()
			if got.NP != tc.want.NP || got.MinNP != tc.want.MinNP || got.MaxNP != tc.want.MaxNP || got.Timeout != tc.want.Timeout {
				t.Errorf("config %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestFailSentinels checks that every way a job ends wraps the sentinel callers branch on.
func TestFailSentinels(t *testing.T) {
	t0 := epoch
	two := []Host{{"a", 1}, {"b", 1}}
	tests := []struct {
		name string
		run  func(p *Planner) Decision
		want error
	}{
		{"first discovery fails", func(p *Planner) Decision {
			return p.DiscoveryFailed(t0, errors.New("exit status 1"))
		}, ErrDiscovery},
		{"never enough slots to start", func(p *Planner) Decision {
			p.Discovered(t0, two[:1])
			return p.Tick(t0.Add(time.Minute))
		}, ErrBelowNP},
		{"below min-np", func(p *Planner) Decision {
			p.Discovered(t0, two)
			p.Discovered(t0, two[:1])
			return p.Tick(t0.Add(time.Minute))
		}, ErrBelowMinNP},
		{"no survivor", func(p *Planner) Decision {
			p.Discovered(t0, two)
			p.Discovered(t0, []Host{{"c", 2}})
			return p.Tick(t0.Add(time.Minute))
		}, ErrNoSurvivor},
		{"all failed", func(p *Planner) Decision {
			p.Discovered(t0, two)
			return p.Failed(t0, Worker{"a", 0}, Worker{"b", 0})
		}, ErrAllFailed},
		{"all blacklisted", func(p *Planner) Decision {
			p.Discovered(t0, []Host{{"a", 2}})
			return p.Failed(t0, Worker{"a", 0})
		}, ErrAllBlacklisted},
		{"reset limit", func(p *Planner) Decision {
			p.Discovered(t0, two)
			p.Discovered(t0, []Host{{"a", 1}, {"b", 1}, {"c", 1}})
			return p.Discovered(t0, two)
		}, ErrResetLimit},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := NewPlanner(Config{NP: 2, MinNP: 2, MaxNP: 3, Timeout: time.Minute, ResetLimit: 1})
			if err != nil {
				t.Fatal(err)
			}
			d := tc.run(p)
			if d.Action != Fail || !errors.Is(d.Err, tc.want) || d.Reason != d.Err.Error() {
				t.Fatalf("got %v (err %v), want a failure wrapping %q", d, d.Err, tc.want)
			}
			if again := p.Tick(t0.Add(time.Hour)); again.Err != d.Err {
				t.Errorf("after failing, Tick says %v", again)
			}
		})
	}
}

func TestInvalidListingIsAFailedDiscovery(t *testing.T) {
	p, err := NewPlanner(Config{NP: 1})
	if err != nil {
		t.Fatal(err)
	}
	p.Discovered(epoch, []Host{{"a", 1}})
	d := p.Discovered(epoch, []Host{{"a", 1}, {"a", 2}})
	if d.Action != Nothing || !strings.Contains(d.Warning, `host "a" listed twice`) {
		t.Errorf("got %v, warning %q", d, d.Warning)
	}
	if d := p.Failed(epoch, Worker{"zz", 0}); d.Action != Nothing || !strings.Contains(d.Warning, "zz[0]") {
		t.Errorf("stray exit: got %v, warning %q", d, d.Warning)
	}
}

// The launcher feeds the planner the wall clock: the seconds a reason counts are rounded to a
// tenth, not printed to the nanosecond ("waited 1.234567891 s").
func TestWaitSecondsAreRounded(t *testing.T) {
	p, err := NewPlanner(Config{NP: 2, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if d := p.Discovered(epoch, []Host{{"a", 1}}); d.Action != Wait {
		t.Fatalf("first decision %v, want a wait", d)
	}
	if d := p.Tick(epoch.Add(1234567891 * time.Nanosecond)); !strings.HasSuffix(d.Reason, "waited 1.2 s of 10 s") {
		t.Errorf("reason %q, want it to end in %q", d.Reason, "waited 1.2 s of 10 s")
	}
	if d := p.Tick(epoch.Add(10*time.Second + 345678)); d.Action != Fail || !strings.HasSuffix(d.Reason, "waited 10 s") {
		t.Errorf("decision %v, want a failure after waiting 10 s", d)
	}
}
