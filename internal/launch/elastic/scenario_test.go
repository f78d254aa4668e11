package elastic

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/testbed/scripttest"
)

var rewrite = flag.Bool("rewrite", false, "rewrite testdata/*.txt with the output the code produces now")

// TestScenarios replays every testdata/*.txt script, in the format of internal/engine/negotiate's: blocks
// of command lines (and # comments), a "----" line, then the expected output up to a blank line.
// Commands:
//
//	config [np=N] [min=N] [max=N] [timeout=DUR] [reset-limit=N] [cooldown=MIN-MAX]
//	       [jitter=F|seed=N] [slots=N]      new Planner, clock back to +0s; slots: --slots-per-host
//	discover [LINE...]              the script printed these lines (none: empty output)
//	discover-raw "QUOTED"           the script printed this Go-quoted text
//	discover-error TEXT...          the script itself failed
//	fail WORKER...                  these workers exited with an error, reported together;
//	                                WORKER is host[slots] (host[0-1,3]) or * (the whole world)
//	tick DUR                        advance the clock and Tick
//	world / blacklist / resets      print the current generation / the blacklist / the count
//
// Every call prints its decision: "hosts: DIFF" for a discovery that changed the listing, a
// "warning:" line, then "ACTION: REASON" ("wait until +T: REASON"), and for a reset one line per
// rank: "RANK HOST[SLOT] local L/LS cross C/CS", with "new" for the newcomers. Every reset is
// also checked against checkReset, so a script need not spell out every invariant.
func TestScenarios(t *testing.T) {
	scripttest.RunDir(t, "testdata", *rewrite, func(t *testing.T) func(string) ([]string, error) {
		s := &scenario{t: t}
		if err := s.config([]string{"np=1"}); err != nil {
			t.Fatal(err)
		}
		return func(line string) ([]string, error) {
			cmd := line
			if !strings.HasPrefix(strings.TrimSpace(cmd), "discover-raw") { // its quoted text may hold '#'
				cmd = scripttest.Uncomment(cmd)
			}
			if strings.TrimSpace(cmd) == "" {
				return nil, nil
			}
			return s.run(strings.Fields(cmd))
		}
	})
}

var epoch = time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)

type scenario struct {
	t     *testing.T
	p     *Planner
	now   time.Time
	slots int    // --slots-per-host
	hosts []Host // the last listing the planner took
	prev  *Generation
}

func (s *scenario) run(f []string) ([]string, error) {
	s.prev = s.p.World()
	switch f[0] {
	case "config":
		return nil, s.config(f[1:])
	case "discover":
		return s.discover(strings.Join(f[1:], "\n")), nil
	case "discover-raw":
		// Fields split the quoted text at its spaces; join them back before unquoting.
		text, err := strconv.Unquote(strings.Join(f[1:], " "))
		if err != nil {
			return nil, fmt.Errorf("discover-raw wants one Go-quoted string: %v", err)
		}
		return s.discover(text), nil
	case "discover-error":
		return s.print(s.p.DiscoveryFailed(s.now, fmt.Errorf("%s", strings.Join(f[1:], " ")))), nil
	case "fail":
		var ws []Worker
		for _, spec := range f[1:] {
			got, err := s.workers(spec)
			if err != nil {
				return nil, err
			}
			ws = append(ws, got...)
		}
		return s.print(s.p.Failed(s.now, ws...)), nil
	case "tick":
		if len(f) != 2 {
			return nil, fmt.Errorf("usage: tick DUR")
		}
		d, err := time.ParseDuration(f[1])
		if err != nil {
			return nil, err
		}
		s.now = s.now.Add(d)
		return s.print(s.p.Tick(s.now)), nil
	case "world":
		g := s.p.World()
		if g == nil {
			return []string{"no generation yet"}, nil
		}
		return append([]string{fmt.Sprintf("generation %d", g.Number)}, formatRanks(g.Ranks, nil)...), nil
	case "blacklist":
		var out []string
		for _, e := range s.p.Blacklist() {
			until := "for good"
			if !e.Until.IsZero() {
				until = "until " + s.at(e.Until)
			}
			out = append(out, fmt.Sprintf("%s: %s, %s", e.Host, plural(e.Failures, "failure"), until))
		}
		if len(out) == 0 {
			out = []string{"(empty)"}
		}
		return out, nil
	case "resets":
		return []string{fmt.Sprintf("%d resets", s.p.Resets())}, nil
	}
	return nil, fmt.Errorf("unknown command %q", f[0])
}

func (s *scenario) config(args []string) error {
	var cfg Config
	cfg.ResetLimit = -1
	s.slots = 0
	for _, kv := range args {
		k, v, _ := strings.Cut(kv, "=")
		var err error
		switch k {
		case "np":
			cfg.NP, err = strconv.Atoi(v)
		case "min":
			cfg.MinNP, err = strconv.Atoi(v)
		case "max":
			cfg.MaxNP, err = strconv.Atoi(v)
		case "timeout":
			cfg.Timeout, err = time.ParseDuration(v)
		case "reset-limit":
			cfg.ResetLimit, err = strconv.Atoi(v)
		case "cooldown":
			lo, hi, _ := strings.Cut(v, "-")
			cfg.Cooldown.Min, err = time.ParseDuration(lo)
			if err == nil {
				cfg.Cooldown.Max, err = time.ParseDuration(hi)
			}
		case "jitter":
			var j float64
			j, err = strconv.ParseFloat(v, 64)
			cfg.Jitter = func() float64 { return j }
		case "seed":
			var seed uint64
			seed, err = strconv.ParseUint(v, 10, 64)
			cfg.Jitter = rand.New(rand.NewPCG(seed, 1)).Float64
		case "slots":
			s.slots, err = strconv.Atoi(v)
		default:
			err = fmt.Errorf("unknown config key %q", k)
		}
		if err != nil {
			return fmt.Errorf("%s: %v", kv, err)
		}
	}
	p, err := NewPlanner(cfg)
	if err != nil {
		return err
	}
	s.p, s.now, s.hosts = p, epoch, nil
	return nil
}

func (s *scenario) discover(text string) []string {
	hosts, err := ParseDiscovery(text, s.slots)
	if err != nil {
		return s.print(s.p.DiscoveryFailed(s.now, err))
	}
	s.hosts = hosts
	return s.print(s.p.Discovered(s.now, hosts))
}

// workers parses "host[0-1,3]" or "*".
func (s *scenario) workers(spec string) ([]Worker, error) {
	if spec == "*" {
		if g := s.p.World(); g != nil {
			return g.Workers(), nil
		}
		return nil, nil
	}
	open := strings.LastIndexByte(spec, '[')
	if open <= 0 || !strings.HasSuffix(spec, "]") {
		return nil, fmt.Errorf("worker %q: want host[slots]", spec)
	}
	host := strings.Trim(spec[:open], "[]")
	var ws []Worker
	for _, part := range strings.Split(spec[open+1:len(spec)-1], ",") {
		a, b, isRange := strings.Cut(part, "-")
		lo, err := strconv.Atoi(a)
		hi := lo
		if err == nil && isRange {
			hi, err = strconv.Atoi(b)
		}
		if err != nil {
			return nil, fmt.Errorf("worker %q: %v", spec, err)
		}
		for i := lo; i <= hi; i++ {
			ws = append(ws, Worker{Host: host, Slot: i})
		}
	}
	return ws, nil
}

func (s *scenario) at(t time.Time) string { return "+" + t.Sub(epoch).String() }

func (s *scenario) print(d Decision) []string {
	s.t.Helper()
	var out []string
	if !d.Discovery.Empty() {
		out = append(out, "hosts: "+d.Discovery.String())
	}
	if d.Warning != "" {
		out = append(out, "warning: "+d.Warning)
	}
	switch d.Action {
	case Wait:
		out = append(out, fmt.Sprintf("wait until %s: %s", s.at(d.Deadline), d.Reason))
	case Fail:
		if d.Err == nil || d.Err.Error() != d.Reason {
			s.t.Errorf("fail decision %q carries error %v", d.Reason, d.Err)
		}
		out = append(out, d.String())
	default:
		out = append(out, d.String())
	}
	if d.Action == Reset {
		if err := checkReset(s.prev, d, s.p.Config(), s.hosts); err != nil {
			s.t.Errorf("%v: %v", d, err)
		}
		out = append(out, formatRanks(d.World.Ranks, d.Start)...)
	}
	return out
}

func formatRanks(ranks []Rank, started []Worker) []string {
	var out []string
	for _, r := range ranks {
		line := fmt.Sprintf("  %d %s local %d/%d cross %d/%d", r.Rank, r.Worker, r.LocalRank, r.LocalSize, r.CrossRank, r.CrossSize)
		if slices.Contains(started, r.Worker) {
			line += " new"
		}
		out = append(out, line)
	}
	return out
}
