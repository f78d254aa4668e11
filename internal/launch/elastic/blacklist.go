package elastic

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Cooldown is --blacklist-cooldown-range MIN MAX. The zero Cooldown means no cooldown: a
// blacklisted host never comes back, Horovod's default.
type Cooldown struct {
	Min, Max time.Duration
}

func (c Cooldown) enabled() bool { return c.Min > 0 }

func (c Cooldown) check() error {
	if c == (Cooldown{}) {
		return nil
	}
	if c.Min <= 0 || c.Max < c.Min {
		return fmt.Errorf("--blacklist-cooldown-range %v %v: want 0 < MIN <= MAX", c.Min, c.Max)
	}
	return nil
}

// Delay is how long a host stays out after its n-th failure (n >= 1): Min doubled for each
// earlier failure, plus jitter (in [0, 1)) times Min, capped at Max. That is the schedule Horovod's
// docs promise (10 s, 20 s, 40 s ... for MIN 10); its code doubles once more, starting at 2*MIN,
// which we do not copy. The jitter keeps hosts that failed together from all returning in the
// same discovery round.
func (c Cooldown) Delay(n int, jitter float64) time.Duration {
	if !c.enabled() {
		return 0
	}
	jitter = min(max(jitter, 0), 1)
	d := c.Min
	for i := 1; i < n && d < c.Max; i++ {
		d *= 2 // stops at Max, so it cannot overflow however many failures a host has
	}
	d += time.Duration(jitter * float64(c.Min))
	return min(d, c.Max)
}

// Blacklist holds the hosts whose ranks failed. A host's failures are counted over the whole job,
// so a host that keeps failing stays out longer each time.
type Blacklist struct {
	cooldown Cooldown
	jitter   func() float64
	hosts    map[string]*Entry
}

// Entry is one blacklisted host.
type Entry struct {
	Host     string
	Failures int       // failures counted, at most one per blacklisting
	Until    time.Time // end of the cooldown; zero: blacklisted for good
}

// NewBlacklist returns an empty blacklist. jitter returns values in [0, 1) (a seeded
// rand.Rand's Float64 in tests); it is only called when cooldown is set.
func NewBlacklist(cooldown Cooldown, jitter func() float64) (*Blacklist, error) {
	if err := cooldown.check(); err != nil {
		return nil, err
	}
	if cooldown.enabled() && jitter == nil {
		return nil, fmt.Errorf("a blacklist cooldown needs a jitter source")
	}
	return &Blacklist{cooldown: cooldown, jitter: jitter, hosts: map[string]*Entry{}}, nil
}

// Add blacklists host after one of its ranks failed at now. It reports false, counting nothing,
// when the host is already out: ranks of one host that fail together are one failure of the host
// (Horovod does the same), or a single bad rank would triple a host's backoff.
func (b *Blacklist) Add(host string, now time.Time) bool {
	if b.Blocked(host, now) {
		return false
	}
	e := b.hosts[host]
	if e == nil {
		e = &Entry{Host: host}
		b.hosts[host] = e
	}
	e.Failures++
	e.Until = time.Time{}
	if b.cooldown.enabled() {
		e.Until = now.Add(b.cooldown.Delay(e.Failures, b.jitter()))
	}
	return true
}

// Blocked reports whether host may not run ranks at now. A cooldown is over at Until exactly.
func (b *Blacklist) Blocked(host string, now time.Time) bool {
	e := b.hosts[host]
	return e != nil && (e.Until.IsZero() || now.Before(e.Until))
}

// Entries lists every host that was ever blacklisted, by name, including those whose cooldown is
// over (their failure count still grows the next cooldown).
func (b *Blacklist) Entries() []Entry {
	out := make([]Entry, 0, len(b.hosts))
	for _, e := range b.hosts {
		out = append(out, *e)
	}
	slices.SortFunc(out, func(x, y Entry) int { return strings.Compare(x.Host, y.Host) })
	return out
}
