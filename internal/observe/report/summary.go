package report

import (
	"cmp"
	"slices"
	"time"
)

// Host is what the launcher shows of one host: its ranks' figures combined.
type Host struct {
	Host  string
	Ranks int
	// MinSteps and MaxSteps bound the ranks' step counts: a gap says a rank fell behind.
	MinSteps, MaxSteps uint64
	// StepMedian is the largest of the ranks' step-time medians: the host's pace.
	StepMedian    time.Duration
	InCollectives time.Duration // summed over the ranks
	BytesReduced  uint64        // summed over the ranks
	OpsFailed     uint64
	// Oldest is the oldest heartbeat (At) of the host's ranks.
	Oldest time.Time
}

// Summary is the bounded view of a job: one line per host and the worst few ranks.
type Summary struct {
	Ranks int
	Hosts []Host // by name
	// Slowest are the ranks with the largest step-time median, slowest first; Stale those with
	// the oldest heartbeats, oldest first. At most `worst` of each.
	Slowest, Stale []*Report
}

// Summarize folds reports (one per rank, any order, nil entries for ranks not heard from) into a
// Summary with at most worst ranks in each list. It costs O(ranks × log worst) time and returns
// O(hosts + worst) data: the launcher renders from it whatever the job's size.
func Summarize(reports []*Report, worst int) Summary {
	s := Summary{}
	byHost := map[string]*Host{}
	for _, r := range reports {
		if r == nil {
			continue
		}
		s.Ranks++
		h := byHost[r.Host]
		if h == nil {
			h = &Host{Host: r.Host, MinSteps: r.Steps, Oldest: r.At}
			byHost[r.Host] = h
		}
		h.Ranks++
		h.MinSteps = min(h.MinSteps, r.Steps)
		h.MaxSteps = max(h.MaxSteps, r.Steps)
		h.StepMedian = max(h.StepMedian, r.StepMedian)
		h.InCollectives += r.InCollectives
		h.BytesReduced += r.BytesReduced
		h.OpsFailed += r.OpsFailed
		if r.At.Before(h.Oldest) {
			h.Oldest = r.At
		}
		s.Slowest = keepWorst(s.Slowest, r, worst, func(a, b *Report) int {
			return cmp.Or(cmp.Compare(b.StepMedian, a.StepMedian), cmp.Compare(a.Rank, b.Rank))
		})
		s.Stale = keepWorst(s.Stale, r, worst, func(a, b *Report) int {
			return cmp.Or(a.At.Compare(b.At), cmp.Compare(a.Rank, b.Rank))
		})
	}
	for _, h := range byHost {
		s.Hosts = append(s.Hosts, *h)
	}
	slices.SortFunc(s.Hosts, func(a, b Host) int { return cmp.Compare(a.Host, b.Host) })
	return s
}

// keepWorst inserts r into list (sorted by less, worst first) and keeps at most k.
func keepWorst(list []*Report, r *Report, k int, less func(a, b *Report) int) []*Report {
	if k <= 0 {
		return list
	}
	i, _ := slices.BinarySearchFunc(list, r, less)
	if i >= k {
		return list
	}
	list = slices.Insert(list, i, r)
	return list[:min(len(list), k)]
}
