package elastic

import (
	"testing"
	"time"
)

func TestCooldownDelay(t *testing.T) {
	s := time.Second
	tests := []struct {
		name     string
		c        Cooldown
		failures int
		jitter   float64
		want     time.Duration
	}{
		{"first failure is MIN", Cooldown{10 * s, 100 * s}, 1, 0, 10 * s},
		{"doubles", Cooldown{10 * s, 100 * s}, 2, 0, 20 * s},
		{"doubles again", Cooldown{10 * s, 100 * s}, 4, 0, 80 * s},
		{"capped at MAX", Cooldown{10 * s, 100 * s}, 5, 0, 100 * s},
		{"jitter adds a fraction of MIN", Cooldown{10 * s, 100 * s}, 2, 0.25, 22500 * time.Millisecond},
		{"cap holds with jitter", Cooldown{10 * s, 100 * s}, 4, 0.9, 89 * s},
		{"cap holds with jitter at MAX", Cooldown{10 * s, 100 * s}, 5, 0.9, 100 * s},
		{"MIN equals MAX", Cooldown{30 * s, 30 * s}, 3, 0.5, 30 * s},
		{"a thousand failures do not overflow", Cooldown{s, time.Hour}, 1000, 0.99, time.Hour},
		{"jitter out of range is clamped", Cooldown{10 * s, 100 * s}, 1, 7, 20 * s},
		{"negative jitter is clamped", Cooldown{10 * s, 100 * s}, 1, -1, 10 * s},
		{"no cooldown", Cooldown{}, 3, 0.5, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.c.Delay(tc.failures, tc.jitter); got != tc.want {
				t.Errorf("Delay(%d, %g) = %v, want %v", tc.failures, tc.jitter, got, tc.want)
			}
		})
	}
}

func TestNewBlacklistChecksRange(t *testing.T) {
	jitter := func() float64 { return 0 }
	for _, c := range []Cooldown{{-time.Second, time.Second}, {10 * time.Second, time.Second}, {0, time.Second}} {
		if _, err := NewBlacklist(c, jitter); err == nil {
			t.Errorf("NewBlacklist(%v) accepted the range", c)
		}
	}
	if _, err := NewBlacklist(Cooldown{time.Second, time.Minute}, nil); err == nil {
		t.Error("a cooldown without a jitter source was accepted")
	}
	if _, err := NewBlacklist(Cooldown{}, nil); err != nil {
		t.Errorf("no cooldown, no jitter: %v", err)
	}
}

func TestBlacklist(t *testing.T) {
	t0 := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	b, err := NewBlacklist(Cooldown{10 * time.Second, time.Minute}, func() float64 { return 0 })
	if err != nil {
		t.Fatal(err)
	}
	if b.Blocked("a", t0) {
		t.Fatal("a host nobody blacklisted is blocked")
	}
	if !b.Add("a", t0) {
		t.Fatal("first failure not counted")
	}
	if b.Add("a", t0.Add(5*time.Second)) {
		t.Error("a failure during the cooldown counted")
	}
	if !b.Blocked("a", t0.Add(10*time.Second-1)) || b.Blocked("a", t0.Add(10*time.Second)) {
		t.Error("the cooldown does not end at exactly 10 s")
	}
	if b.Blocked("localhost", t0) || b.Blocked("127.0.0.1", t0) {
		t.Error("another name is blocked")
	}
	b.Add("a", t0.Add(10*time.Second))
	want := []Entry{{Host: "a", Failures: 2, Until: t0.Add(30 * time.Second)}}
	if got := b.Entries(); len(got) != 1 || got[0] != want[0] {
		t.Errorf("Entries() = %+v, want %+v", got, want)
	}

	forever, _ := NewBlacklist(Cooldown{}, nil)
	forever.Add("b", t0)
	if !forever.Blocked("b", t0.Add(1000*time.Hour)) {
		t.Error("a host without cooldown came back")
	}
	if e := forever.Entries(); len(e) != 1 || !e[0].Until.IsZero() {
		t.Errorf("permanent entry %+v has an end", e)
	}
}
