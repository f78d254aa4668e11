// Package elastic decides, for an elastic job (Horovod's elastic mode: hosts come and go, the
// surviving workers keep running), when the job needs a new generation of its world, which
// workers it has and which ranks they get, and when it must wait or give up, and says why.
//
// It is the pure planning core of kolo run's elastic mode, in the style of internal/engine/negotiate: no
// processes, no sockets, no goroutines, no clock and no logging. The launcher (package launch)
// runs the --host-discovery-script, parses its output with ParseDiscovery, starts and stops
// workers, and feeds a Planner what happened (Discovered, DiscoveryFailed, Failed) and the time
// (Tick), then acts on the Decision each call returns. Keeping those apart is what lets every
// Horovod elastic scenario (hosts added and removed, ranks failing, hosts blacklisted and coming
// back, too few slots until a timeout) be a text script in testdata/ that runs in microseconds,
// with exact plans asserted and no sleep. The package must not import launch: launch is meant
// to import it, so it has its own small Host type rather than launch.Host.
package elastic

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// DefaultTimeout is how long a job waits for enough slots before failing when Config.Timeout is
// 0: Horovod's HOROVOD_ELASTIC_TIMEOUT default.
const DefaultTimeout = 600 * time.Second

// Config is what kolo run's elastic flags ask for.
type Config struct {
	NP    int // -np: slots needed before the first generation starts; 0: MinNP
	MinNP int // --min-np: fewer slots than this and the job waits; 0: NP
	MaxNP int // --max-np: a generation never has more ranks; 0: no limit (Horovod's default: every slot discovered)

	// Timeout is how long the job may wait for NP (MinNP, after the start) slots, or for a
	// survivor's host to come back, before it fails; 0: DefaultTimeout.
	Timeout time.Duration

	// ResetLimit is --reset-limit: how many generations may follow the first; negative: no
	// limit (Horovod's default). Every new generation counts, whatever caused it: a failure, a
	// host leaving, a host joining or one back from its cooldown. That is how Horovod counts
	// (its reset-limit test reaches the limit with one addition and one removal) and what its
	// docs say ("times the job can scale up or down"). When the limit is reached the job fails at
	// the next change, even a host joining, since Horovod fails then too; a change that alters
	// no worker (a host beyond --max-np) is no reset and counts nothing.
	ResetLimit int

	Cooldown Cooldown       // --blacklist-cooldown-range; zero: blacklisting is for good
	Jitter   func() float64 // values in [0, 1) for the cooldown's random part; needed with Cooldown
}

// Sentinel errors a Fail decision's Err wraps, for callers that branch on why the job ended.
var (
	ErrDiscovery      = errors.New("host discovery failed on its first run")
	ErrBelowNP        = errors.New("below -np")
	ErrBelowMinNP     = errors.New("below min-np")
	ErrNoSurvivor     = errors.New("no survivor")
	ErrAllFailed      = errors.New("all ranks failed")
	ErrAllBlacklisted = errors.New("every host blacklisted")
	ErrResetLimit     = errors.New("reset limit reached")
)

// Action is what the launcher must do.
type Action int

const (
	Nothing Action = iota // keep running the current generation
	Wait                  // pause: too few slots; the job fails at Decision.Deadline
	Reset                 // stop Lost, start Start, and have every worker join Decision.World
	Fail                  // stop every worker; Decision.Err says why
)

func (a Action) String() string { return name(int(a), "action", "nothing", "wait", "reset", "fail") }

// Cause is why a worker is not in the next generation.
type Cause int

const (
	Exited          Cause = iota + 1 // its process failed (the launcher need not stop it)
	HostBlacklisted                  // another rank on its host failed
	HostRemoved                      // its host left the discovery
	SlotRemoved                      // its host is still listed, with fewer slots
)

func (c Cause) String() string {
	return name(int(c), "cause", "", "failed", "host blacklisted", "host left discovery", "slot no longer listed")
}

// name is names[i], or kind(i) for a value without one.
func name(i int, kind string, names ...string) string {
	if i >= 0 && i < len(names) && names[i] != "" {
		return names[i]
	}
	return fmt.Sprintf("%s(%d)", kind, i)
}

// Loss is a worker of the current generation that the next one does not have.
type Loss struct {
	Worker
	Cause Cause
}

// Generation is one world: its ranks, by global rank. Generation 1 is the first.
type Generation struct {
	Number int
	Ranks  []Rank
}

// Workers lists the generation's workers in rank order.
func (g *Generation) Workers() []Worker { return workers(g.Ranks) }

func workers(ranks []Rank) (ws []Worker) {
	for _, r := range ranks {
		ws = append(ws, r.Worker)
	}
	return ws
}

// Decision is what a Planner wants done, and why.
type Decision struct {
	Action Action
	Reason string // one line for the log; for Fail, Err's text
	Err    error  // Fail only: wraps one of the Err* sentinels

	Deadline time.Time // Wait: when the job fails if it is still short

	// Reset only. World is the new generation; Lost are the old generation's workers it does
	// not have, in old rank order (the launcher stops those still running); Start are its
	// newcomers, in rank order. Every other worker of World is a survivor, on its old host and
	// slot, and only needs its new rank.
	World *Generation
	Lost  []Loss
	Start []Worker

	Discovery Diff   // Discovered only: what changed since the previous discovery
	Warning   string // trouble that did not change the decision: a failed discovery, stray exits
}

func (d Decision) String() string { return d.Action.String() + ": " + d.Reason }

// Planner holds an elastic job's state between events. Every method takes the time of the event
// and returns what to do now; none blocks. A Planner is not safe for concurrent use: the
// launcher's event loop owns it.
type Planner struct {
	cfg       Config
	blacklist *Blacklist

	discovered bool
	hosts      []Host // the last discovery, in its order

	gen    *Generation
	out    map[Worker]Cause // workers of gen that can never survive: Exited or HostBlacklisted
	resets int

	waitingSince time.Time // zero unless the last decision was Wait
	failed       *Decision // sticky once set
}

// NewPlanner checks cfg and fills in its defaults.
func NewPlanner(cfg Config) (*Planner, error) {
	if cfg.NP == 0 {
		cfg.NP = cfg.MinNP
	}
	if cfg.MinNP == 0 {
		cfg.MinNP = cfg.NP
	}
	switch {
	case cfg.MinNP <= 0:
		return nil, fmt.Errorf("elastic: -np or --min-np must be at least 1 (got -np %d, --min-np %d)", cfg.NP, cfg.MinNP)
	case cfg.MaxNP != 0 && cfg.MaxNP < cfg.MinNP:
		return nil, fmt.Errorf("elastic: --max-np %d is below --min-np %d", cfg.MaxNP, cfg.MinNP)
	case cfg.NP < cfg.MinNP || (cfg.MaxNP != 0 && cfg.NP > cfg.MaxNP):
		return nil, fmt.Errorf("elastic: -np %d is outside --min-np %d .. --max-np %d", cfg.NP, cfg.MinNP, cfg.MaxNP)
	case cfg.Timeout < 0:
		return nil, fmt.Errorf("elastic: negative timeout %v", cfg.Timeout)
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultTimeout
	}
	bl, err := NewBlacklist(cfg.Cooldown, cfg.Jitter)
	if err != nil {
		return nil, fmt.Errorf("elastic: %w", err)
	}
	return &Planner{cfg: cfg, blacklist: bl}, nil
}

// Config returns the configuration with its defaults filled in.
func (p *Planner) Config() Config { return p.cfg }

// World returns the current generation, nil before the first.
func (p *Planner) World() *Generation { return p.gen }

// Resets returns how many generations have followed the first.
func (p *Planner) Resets() int { return p.resets }

// Blacklist returns every host ever blacklisted.
func (p *Planner) Blacklist() []Entry { return p.blacklist.Entries() }

// Discovered takes a successful discovery: the hosts listed, in the script's order. A listing
// that is not valid (a host twice, no slots) is a failed discovery.
func (p *Planner) Discovered(now time.Time, hosts []Host) Decision {
	if err := checkHosts(hosts); err != nil {
		return p.DiscoveryFailed(now, err)
	}
	diff := Compare(p.hosts, hosts)
	p.hosts = append([]Host(nil), hosts...)
	p.discovered = true
	d := p.decide(now)
	d.Discovery = diff
	return d
}

// DiscoveryFailed takes a discovery that did not produce a listing: the script failed or printed
// garbage. The first discovery failing ends the job, since that is a misconfiguration; later
// failures keep the last listing, as Horovod does, and a job that is short of slots meanwhile
// still fails at its deadline.
func (p *Planner) DiscoveryFailed(now time.Time, err error) Decision {
	if !p.discovered && p.failed == nil {
		return p.fail(fmt.Errorf("%w: %w", ErrDiscovery, err))
	}
	d := p.decide(now)
	if d.Action != Fail {
		d.Warning = "host discovery failed, keeping the last hosts: " + err.Error()
	}
	return d
}

// Failed takes workers of the current generation whose process exited with an error. Report
// together the exits seen together (Horovod gathers them at its rendezvous barrier): the job
// fails when all ranks of a generation failed, which one-by-one reports would read as a string
// of single failures. Each failed worker's host is blacklisted. Workers not in the current
// generation are ignored, with a warning: a worker stopped by an earlier Reset exits with an
// error too, and that is no failure of its host. The other workers of a blacklisted host are
// stopped at the next Reset (Lost, HostBlacklisted); until then they are idle at the rendezvous.
func (p *Planner) Failed(now time.Time, workers ...Worker) Decision {
	var stray []Worker
	for _, w := range workers {
		if !p.inWorld(w) {
			stray = append(stray, w)
			continue
		}
		p.out[w] = Exited
		p.blacklist.Add(w.Host, now)
	}
	for _, r := range p.worldRanks() {
		if _, gone := p.out[r.Worker]; !gone && p.blacklist.Blocked(r.Host, now) {
			p.out[r.Worker] = HostBlacklisted
		}
	}
	d := p.decide(now)
	if len(stray) > 0 && d.Action != Fail {
		d.Warning = "ignored exits of workers not in the current generation: " + formatWorkers(stray)
	}
	return d
}

// Tick takes the passing of time: a wait's deadline, a cooldown ending.
func (p *Planner) Tick(now time.Time) Decision { return p.decide(now) }

func (p *Planner) worldRanks() []Rank {
	if p.gen == nil {
		return nil
	}
	return p.gen.Ranks
}

func (p *Planner) inWorld(w Worker) bool {
	return slices.ContainsFunc(p.worldRanks(), func(r Rank) bool { return r.Worker == w })
}

// decide is the whole policy, in the order Horovod applies it.
func (p *Planner) decide(now time.Time) Decision {
	if p.failed != nil {
		return *p.failed
	}
	if d, ok := p.noneLeft(); ok {
		return d
	}

	var avail []Host
	slots := 0
	for _, h := range p.hosts {
		if !p.blacklist.Blocked(h.Name, now) {
			avail = append(avail, h)
			slots += h.Slots
		}
	}
	survivors, lost := p.survivors(avail)
	limit := p.cfg.MaxNP
	if limit == 0 {
		limit = math.MaxInt
	}
	ranks, err := Assign(survivors, avail, limit)
	if err != nil {
		// Survivors come from avail and never exceed MaxNP, so this is a bug in this package;
		// failing the job says so without taking the launcher down with a panic.
		return p.fail(fmt.Errorf("elastic: internal error assigning ranks: %w", err))
	}
	if p.gen != nil && len(lost) == 0 && len(ranks) == len(p.gen.Ranks) {
		p.waitingSince = time.Time{}
		return Decision{Action: Nothing, Reason: p.unchanged(slots)}
	}
	start := workers(ranks[len(survivors):])
	if p.gen != nil && p.cfg.ResetLimit >= 0 && p.resets >= p.cfg.ResetLimit {
		return p.fail(fmt.Errorf("%w: %s done, --reset-limit %d; generation %d was needed: %s",
			ErrResetLimit, plural(p.resets, "reset"), p.cfg.ResetLimit, p.gen.Number+1, changes(lost, start)))
	}

	need, flag, sentinel := p.cfg.MinNP, "--min-np", ErrBelowMinNP
	if p.gen == nil {
		need, flag, sentinel = p.cfg.NP, "-np", ErrBelowNP
	}
	if slots < need {
		return p.wait(now, sentinel, fmt.Sprintf("%s available on %s, %s %d",
			plural(slots, "slot"), plural(len(avail), "host"), flag, need))
	}
	if p.gen != nil && len(survivors) == 0 {
		// Every worker left is alive on a host that left the discovery: the state lives only
		// there, so wait for one of them to come back rather than start over from nothing.
		return p.wait(now, ErrNoSurvivor, fmt.Sprintf("none of generation %d's %s is left to broadcast the state from; lost %s",
			p.gen.Number, plural(len(p.gen.Ranks), "worker"), formatLosses(lost)))
	}

	next := &Generation{Number: 1, Ranks: ranks}
	reason := fmt.Sprintf("generation 1: %s on %s", plural(len(ranks), "rank"), plural(countHosts(ranks), "host"))
	if p.gen != nil {
		next.Number = p.gen.Number + 1
		p.resets++
		limit := ""
		if p.cfg.ResetLimit >= 0 {
			limit = fmt.Sprintf(" of --reset-limit %d", p.cfg.ResetLimit)
		}
		reason = fmt.Sprintf("generation %d (reset %d%s): %s; %s on %s", next.Number, p.resets, limit,
			changes(lost, start), plural(len(ranks), "rank"), plural(countHosts(ranks), "host"))
	}
	d := Decision{Action: Reset, Reason: reason, World: next, Lost: lost, Start: start}
	p.gen, p.out, p.waitingSince = next, map[Worker]Cause{}, time.Time{}
	return d
}

// noneLeft fails the job when no worker of the current generation can go on: there is nobody to
// broadcast the training state from. Horovod stops in both cases too.
func (p *Planner) noneLeft() (Decision, bool) {
	if p.gen == nil {
		return Decision{}, false
	}
	exited := 0
	var hosts []string
	seen := map[string]bool{}
	for _, r := range p.gen.Ranks {
		cause, gone := p.out[r.Worker]
		if !gone {
			return Decision{}, false
		}
		if cause == Exited {
			exited++
		}
		if !seen[r.Host] {
			seen[r.Host] = true
			hosts = append(hosts, r.Host)
		}
	}
	if exited == len(p.gen.Ranks) {
		return p.fail(fmt.Errorf("%w: the %s of generation %d exited with an error",
			ErrAllFailed, plural(exited, "rank"), p.gen.Number)), true
	}
	return p.fail(fmt.Errorf("%w: %s (generation %d's %s, %d of %d ranks failed)",
		ErrAllBlacklisted, strings.Join(hosts, ", "), p.gen.Number, plural(len(hosts), "host"), exited, len(p.gen.Ranks))), true
}

// survivors returns the current generation's workers that can go on, in rank order, and the
// others with why not.
func (p *Planner) survivors(avail []Host) ([]Worker, []Loss) {
	slots := make(map[string]int, len(avail))
	for _, h := range avail {
		slots[h.Name] = h.Slots
	}
	listed := make(map[string]bool, len(p.hosts))
	for _, h := range p.hosts {
		listed[h.Name] = true
	}
	var keep []Worker
	var lost []Loss
	for _, r := range p.worldRanks() {
		w := r.Worker
		n, ok := slots[w.Host]
		switch cause, gone := p.out[w]; {
		case gone:
			lost = append(lost, Loss{w, cause})
		case !listed[w.Host]:
			lost = append(lost, Loss{w, HostRemoved})
		case !ok:
			// Listed but blocked: its cooldown is still running though none of this
			// generation's ranks failed there. Failed marks those; this is a safety net.
			lost = append(lost, Loss{w, HostBlacklisted})
		case w.Slot >= n:
			lost = append(lost, Loss{w, SlotRemoved})
		default:
			keep = append(keep, w)
		}
	}
	return keep, lost
}

// wait returns a Wait decision, or the Fail one once the wait has lasted Timeout. The deadline
// counts from the first decision of an unbroken run of waits, whatever the cause, so a job
// cannot wait forever by being short for different reasons in turn.
func (p *Planner) wait(now time.Time, sentinel error, why string) Decision {
	if p.waitingSince.IsZero() {
		p.waitingSince = now
	}
	deadline := p.waitingSince.Add(p.cfg.Timeout)
	waited := seconds(now.Sub(p.waitingSince))
	if !now.Before(deadline) {
		return p.fail(fmt.Errorf("%w: %s, waited %s s", sentinel, why, waited))
	}
	return Decision{Action: Wait, Deadline: deadline,
		Reason: fmt.Sprintf("%v: %s; waited %s s of %s s", sentinel, why, waited, seconds(p.cfg.Timeout))}
}

func (p *Planner) fail(err error) Decision {
	d := Decision{Action: Fail, Reason: err.Error(), Err: err}
	p.failed = &d
	return d
}

func (p *Planner) unchanged(slots int) string {
	n := len(p.gen.Ranks)
	if n == p.cfg.MaxNP && slots > n {
		return fmt.Sprintf("generation %d unchanged: it has --max-np %d ranks; %s unused",
			p.gen.Number, n, plural(slots-n, "slot"))
	}
	return fmt.Sprintf("generation %d unchanged", p.gen.Number)
}

// changes describes a reset: "lost a[0-1] (host left discovery); started b[0-1]".
func changes(lost []Loss, start []Worker) string {
	var parts []string
	if len(lost) > 0 {
		parts = append(parts, "lost "+formatLosses(lost))
	}
	if len(start) > 0 {
		parts = append(parts, "started "+formatWorkers(start))
	}
	return strings.Join(parts, "; ")
}

// formatLosses groups losses by cause, in order of first appearance.
func formatLosses(lost []Loss) string {
	var causes []Cause
	byCause := map[Cause][]Worker{}
	for _, l := range lost {
		if _, ok := byCause[l.Cause]; !ok {
			causes = append(causes, l.Cause)
		}
		byCause[l.Cause] = append(byCause[l.Cause], l.Worker)
	}
	parts := make([]string, len(causes))
	for i, c := range causes {
		parts[i] = fmt.Sprintf("%s (%s)", formatWorkers(byCause[c]), c)
	}
	return strings.Join(parts, ", ")
}

func countHosts(ranks []Rank) int {
	seen := map[string]bool{}
	for _, r := range ranks {
		seen[r.Host] = true
	}
	return len(seen)
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// seconds writes d in seconds, to a tenth: the launcher gives wall-clock times.
func seconds(d time.Duration) string {
	return strconv.FormatFloat(d.Round(100*time.Millisecond).Seconds(), 'f', -1, 64)
}
