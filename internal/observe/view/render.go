package view

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kolo-dl/kolo/internal/observe/flight"
	"github.com/kolo-dl/kolo/internal/observe/report"
)

// RateWindow is how far back the steps/s figure looks.
const RateWindow = 10 * time.Second

// Status is the live status block at now: a few lines, each a sentence a user reads at a glance.
// silentAfter is how old a rank's last report may be before the rank is called silent.
func (s *State) Status(now time.Time, silentAfter time.Duration) []string {
	sum := report.Summarize(s.reports, 3)
	if sum.Ranks == 0 {
		return []string{fmt.Sprintf("kolo: waiting for the first reports of %d ranks", s.size)}
	}
	parts := []string{fmt.Sprintf("kolo: step %d", s.maxSteps)}
	if rate := s.StepRate(now, RateWindow); rate > 0 {
		parts = append(parts, fmt.Sprintf("%.1f steps/s", rate))
	}
	var med, p95 time.Duration
	var bytes uint64
	for _, r := range s.reports {
		if r != nil {
			med, p95 = max(med, r.StepMedian), max(p95, r.StepP95)
			bytes += r.BytesReduced
		}
	}
	if med > 0 {
		parts = append(parts, fmt.Sprintf("%s/step (p95 %s)", dur(med), dur(p95)))
	}
	ranks := count(s.size, "rank") + " on " + count(len(sum.Hosts), "host")
	if sum.Ranks < s.size {
		ranks = fmt.Sprintf("%d of %s reporting, on %s", sum.Ranks, count(s.size, "rank"), count(len(sum.Hosts), "host"))
	}
	parts = append(parts, ranks)
	if bytes > 0 {
		parts = append(parts, bytesSI(bytes)+" reduced")
	}
	lines := []string{strings.Join(parts, " · ")}

	if v, ok := s.slowest(); ok {
		lines = append(lines, "slowest: "+v)
	}
	if st := s.straggle; st != nil {
		for i, p := range st.Stalled {
			if i == 2 {
				lines = append(lines, "stalled: "+count(len(st.Stalled)-2, "more op"))
				break
			}
			lines = append(lines, fmt.Sprintf("stalled: %q for %s, waiting on %s (%d of %d ranks submitted it)",
				p.Name, dur(s.age(now, 0, p.Since)), missingList(p), p.Arrived, p.Arrived+p.MissingCount))
		}
	}
	var silent []string
	for _, r := range sum.Stale {
		if age := now.Sub(s.received[r.Rank]); age >= silentAfter {
			silent = append(silent, fmt.Sprintf("rank %d on %s (no report for %s)", r.Rank, r.Host, dur(age)))
		}
	}
	if len(silent) > 0 {
		lines = append(lines, "silent: "+strings.Join(silent, ", "))
	}
	if s.resets > 0 {
		lines = append(lines, fmt.Sprintf("elastic: %s, %s now", count(s.resets, "reset"), count(s.size, "rank")))
	}
	return lines
}

func missingList(p report.Stalled) string {
	l := rankList(p.Missing, 4)
	if p.MissingCount > len(p.Missing) {
		l += fmt.Sprintf(" and %d more", p.MissingCount-len(p.Missing))
	}
	return l
}

// slowest is the verdict sentence on rank 0's named rank, if any.
func (s *State) slowest() (string, bool) {
	st := s.straggle
	if st == nil || st.Slowest < 0 || st.Slowest >= s.size {
		return "", false
	}
	i := slices.IndexFunc(st.Ranks, func(l report.Late) bool { return l.Rank == st.Slowest })
	if i < 0 || st.Samples == 0 {
		return "", false
	}
	l := st.Ranks[i]
	host := "an unknown host"
	if r := s.reports[l.Rank]; r != nil {
		host = r.Host
	}
	return fmt.Sprintf("rank %d on %s arrives last in %s of %s, %s after the median of the others",
		l.Rank, host, percent(float64(l.Last)/float64(st.Samples)), st.Unit, dur(l.Lateness)), true
}

// PerRankRows is the largest job whose end table has a row per rank; a larger one gets a row per
// host and the slowest ranks.
const PerRankRows = 64

// EndTable is the table printed when the job ends, markdown-like: a row per rank (per host and the
// 16 slowest ranks in a job larger than PerRankRows).
func (s *State) EndTable() string {
	head := []string{"rank", "host", "steps", "step median", "step p95", "lateness", "in collectives", "reduced"}
	var rows [][]string
	rankRow := func(rank int, r *report.Report) []string {
		if r == nil {
			return []string{strconv.Itoa(rank), "-", "-", "-", "-", "-", "-", "-"}
		}
		late := "-"
		if l, ok := s.Lateness(rank); ok {
			late = dur(l)
		}
		coll := dur(r.InCollectives)
		if r.Up > 0 {
			coll += fmt.Sprintf(" (%s)", percent(r.InCollectives.Seconds()/r.Up.Seconds()))
		}
		return []string{strconv.Itoa(rank), r.Host, strconv.FormatUint(r.Steps, 10), dur(r.StepMedian), dur(r.StepP95), late, coll, bytesSI(r.BytesReduced)}
	}
	var b strings.Builder
	if s.size <= PerRankRows {
		for rank, r := range s.reports {
			rows = append(rows, rankRow(rank, r))
		}
		writeTable(&b, head, rows)
		return b.String()
	}
	sum := report.Summarize(s.reports, 16)
	hostHead := []string{"host", "ranks", "steps", "slowest step median", "in collectives", "reduced"}
	for _, h := range sum.Hosts {
		steps := strconv.FormatUint(h.MinSteps, 10)
		if h.MaxSteps != h.MinSteps {
			steps += "-" + strconv.FormatUint(h.MaxSteps, 10)
		}
		rows = append(rows, []string{h.Host, strconv.Itoa(h.Ranks), steps, dur(h.StepMedian), dur(h.InCollectives), bytesSI(h.BytesReduced)})
	}
	writeTable(&b, hostHead, rows)
	b.WriteString("\nslowest ranks:\n\n")
	rows = rows[:0]
	for _, r := range sum.Slowest {
		rows = append(rows, rankRow(r.Rank, r))
	}
	writeTable(&b, head, rows)
	return b.String()
}

// writeTable writes a markdown table, the first column left-aligned and the rest right-aligned
// except a column called "host".
func writeTable(b *strings.Builder, head []string, rows [][]string) {
	width := make([]int, len(head))
	for i, h := range head {
		width[i] = len(h)
	}
	for _, row := range rows {
		for i, c := range row {
			width[i] = max(width[i], len(c))
		}
	}
	left := func(i int) bool { return head[i] == "host" }
	line := func(cells []string) {
		b.WriteString("|")
		for i, c := range cells {
			pad := strings.Repeat(" ", width[i]-len(c))
			if left(i) {
				fmt.Fprintf(b, " %s%s |", c, pad)
			} else {
				fmt.Fprintf(b, " %s%s |", pad, c)
			}
		}
		b.WriteString("\n")
	}
	line(head)
	b.WriteString("|")
	for i := range head {
		if left(i) {
			fmt.Fprintf(b, ":%s|", strings.Repeat("-", width[i]+1))
		} else {
			fmt.Fprintf(b, "%s:|", strings.Repeat("-", width[i]+1))
		}
	}
	b.WriteString("\n")
	for _, row := range rows {
		line(row)
	}
}

// StallText says, for a stall past warn or a failure, what each rank involved is in and what it
// waits for: ranks in the same op and state share a line, then each rank they wait on gets one.
// At most limit lines of each kind; the rest are counted.
func (s *State) StallText(now time.Time, warn time.Duration, limit int) string {
	type key struct {
		name, kind string
		state      flight.State
	}
	groups := map[key][]int{}
	var order []key
	oldest := map[key]time.Duration{}
	for rank, r := range s.reports {
		if r == nil || r.Current == nil {
			continue
		}
		age := s.age(now, rank, r.Current.Submitted)
		if age < warn {
			continue
		}
		k := key{r.Current.Name, r.Current.Kind, r.Current.State}
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], rank)
		oldest[k] = max(oldest[k], age)
	}
	slices.SortFunc(order, func(a, b key) int { return groups[a][0] - groups[b][0] })

	var lines []string
	waitedOn := map[int]bool{}
	for i, k := range order {
		if i == limit {
			lines = append(lines, fmt.Sprintf("... and %d more ops with ranks in them", len(order)-limit))
			break
		}
		ranks := groups[k]
		verb := "is"
		if len(ranks) > 1 {
			verb = "are"
		}
		var wait string
		behind := s.behind(k.name, ranks)
		switch k.state {
		case flight.Submitted:
			if p, ok := s.stalledOp(k.name); ok {
				wait = "not negotiated: waiting for " + missingList(p) + " to submit it"
				behind = p.Missing
			} else {
				wait = "not negotiated yet"
			}
		default:
			switch {
			case len(behind) == 0:
				wait = k.state.String() + ", waiting in the collective"
			case len(behind) == 1:
				wait = fmt.Sprintf("%s, waiting on rank %d's data", k.state, behind[0])
			default:
				wait = fmt.Sprintf("%s, waiting on the data of %s", k.state, rankList(behind, 4))
			}
		}
		for _, r := range behind {
			waitedOn[r] = true
		}
		who := rankList(ranks, 4)
		if len(ranks) == 1 {
			who += " on " + s.reports[ranks[0]].Host
		}
		lines = append(lines, fmt.Sprintf("%s %s still in %s %q (submitted %s ago, %s)",
			who, verb, k.kind, k.name, dur(oldest[k]), wait))
		if len(ranks) == 1 {
			lines = s.appendLastOps(lines, now, ranks[0])
		}
	}
	grouped := map[int]bool{}
	for _, ranks := range groups {
		for _, r := range ranks {
			grouped[r] = true
		}
	}
	others := make([]int, 0, len(waitedOn))
	for r := range waitedOn {
		if !grouped[r] { // a rank stuck in an op of its own has its line already
			others = append(others, r)
		}
	}
	slices.Sort(others)
	for i, rank := range others {
		if i == limit {
			lines = append(lines, fmt.Sprintf("... and %d more ranks waited on", len(others)-limit))
			break
		}
		lines = append(lines, s.rankDoing(now, rank))
		lines = s.appendLastOps(lines, now, rank)
	}
	if len(lines) == 0 {
		return ""
	}
	return strings.Join(lines, "\n") + "\n"
}

// behind is the ranks, among those not in ranks, whose reports show them not in op name: they have
// not reached it (or left the job's ops behind), so the ranks in it wait on their data.
func (s *State) behind(name string, ranks []int) []int {
	var out []int
	for rank, r := range s.reports {
		if slices.Contains(ranks, rank) {
			continue
		}
		if r == nil || r.Current == nil || r.Current.Name != name {
			out = append(out, rank)
		}
	}
	return out
}

func (s *State) stalledOp(name string) (report.Stalled, bool) {
	if s.straggle == nil {
		return report.Stalled{}, false
	}
	for _, p := range s.straggle.Stalled {
		if p.Name == name {
			return p, true
		}
	}
	return report.Stalled{}, false
}

// rankDoing is one sentence on what rank is doing.
func (s *State) rankDoing(now time.Time, rank int) string {
	r := s.reports[rank]
	if r == nil {
		return fmt.Sprintf("rank %d has sent no report", rank)
	}
	if c := r.Current; c != nil {
		return fmt.Sprintf("rank %d on %s is in %s %q (submitted %s ago, %s)", rank, r.Host, c.Kind, c.Name, dur(s.age(now, rank, c.Submitted)), c.State)
	}
	if len(r.Last) == 0 {
		return fmt.Sprintf("rank %d on %s has finished no op and has submitted nothing", rank, r.Host)
	}
	l := r.Last[len(r.Last)-1]
	return fmt.Sprintf("rank %d on %s last finished %q %s ago and has submitted nothing since", rank, r.Host, l.Name, dur(s.age(now, rank, l.Finished)))
}

// LastOps is how many of a rank's last finished ops the stall text lists under it.
const LastOps = 3

// appendLastOps adds an indented line with rank's last finished ops, oldest first, if it reported
// any.
func (s *State) appendLastOps(lines []string, now time.Time, rank int) []string {
	r := s.reports[rank]
	if r == nil || len(r.Last) == 0 {
		return lines
	}
	var ops []string
	for _, o := range r.Last[max(0, len(r.Last)-LastOps):] {
		when := ""
		if !o.Finished.IsZero() {
			when = " " + dur(s.age(now, rank, o.Finished)) + " ago"
		}
		ops = append(ops, fmt.Sprintf("%s %q (%s%s)", o.Kind, o.Name, o.State, when))
	}
	return append(lines, "    last ops: "+strings.Join(ops, ", "))
}

// count writes n and a noun, plural unless n is 1: "1 host", "2 hosts".
func count(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return strconv.Itoa(n) + " " + noun + "s"
}
