package proc

import (
	"fmt"
	"strings"

	"github.com/kolo-dl/kolo/internal/observe/report"
)

// Blame returns the rank that the job's failure traces back to, starting from first (the earliest
// rank to fail on its own), by the failure records the ranks sent (report.Failure, by rank). A rank
// that fails because another one did (a peer lost, stuck, ended early, or one that failed and told
// it) can exit before that rank; its record names the rank it blames, and Blame follows the
// records, rank by rank:
//   - to a rank found stuck (it made no progress: the launcher finds it alive, and stops it) or
//     ended early (it reached shutdown while the others still needed it, and may exit 0);
//   - to a rank that told the others it failed, unless it then exited cleanly;
//   - to a rank reported lost if it failed too, of something other than the launcher's stop
//     signal (one the launcher stopped was alive when the failure began), or if it exited cleanly
//     before first failed (it ended while the others still needed it);
//   - not to one whose own record blames this rank for more than what this record reports (a
//     loss, or a peer's failure, that followed from that: outweighed).
//
// The chain ends at a rank whose record blames nobody (its own exception or error), at one that
// sent no record (killed: its exit status is all there is), or where it would go round. Without
// records, first is the answer.
func Blame(results []Result, first *Result, records map[int]report.Failure) *Result {
	if first == nil {
		return nil
	}
	byRank := make(map[int]*Result, len(results))
	for i := range results {
		byRank[results[i].Slot.Rank] = &results[i]
	}
	seen := map[int]bool{first.Slot.Rank: true}
	cur := first
	for {
		rec, ok := records[cur.Slot.Rank]
		if !ok || rec.Own() {
			return cur
		}
		next := byRank[rec.Blames]
		if next == nil || seen[next.Slot.Rank] || !toBlame(rec.Kind, next, first) || outweighed(rec, records) {
			return cur
		}
		seen[next.Slot.Rank] = true
		cur = next
	}
}

// outweighed reports whether rec is answered by the record of the rank it blames, naming rec's
// sender for what caused the failure: the failure followed from that. A rank that ended early
// loses the others, or hears from one that failed on its account, when they fail because of it;
// a rank found stuck loses those that gave up on it.
func outweighed(rec report.Failure, records map[int]report.Failure) bool {
	back, ok := records[rec.Blames]
	if !ok || back.Own() || back.Blames != rec.Rank {
		return false
	}
	switch rec.Kind {
	case report.KindLost:
		return back.Kind != report.KindLost
	case report.KindPeerFailed:
		return back.Kind == report.KindEnded || back.Kind == report.KindStalled
	}
	return false
}

// toBlame reports whether next, the rank a record of kind blames, is where the failure goes on.
func toBlame(kind report.Kind, next, first *Result) bool {
	switch kind {
	case report.KindStalled, report.KindEnded:
		return true
	case report.KindPeerFailed:
		return next.Exit.Failed()
	case report.KindLost:
		if !next.Exit.Failed() {
			return !next.Ended.IsZero() && next.Ended.Before(first.Ended)
		}
		// Not one that ended of the launcher's own stop signal: its loss is a consequence of the
		// failure rather than its cause.
		return !(next.Stopped && next.Exit.Signal == StopSignal)
	}
	return false
}

// Summary renders the report the launcher prints when a job fails: the rank the failure traces
// back to (Blame), its host, how it ended, what its own record or else the record that named it says and
// its last stderr lines, then how every other rank ended and, if it sent one, its record's kind.
func Summary(results []Result, first *Result, records map[int]report.Failure) string {
	var b strings.Builder
	if first == nil {
		return ""
	}
	switch {
	case first.Stopped:
		// Blame traced the failure to a rank that was still winding down (or stuck) when the
		// launcher stopped it.
		fmt.Fprintf(&b, "kolo run: rank %d on %s failed first (then stopped by the launcher: %s).\n", first.Slot.Rank, first.Slot.Host, first.Exit)
	case !first.Exit.Failed():
		fmt.Fprintf(&b, "kolo run: rank %d on %s ended (%s) while other ranks still needed it (the first rank to fail).\n", first.Slot.Rank, first.Slot.Host, first.Exit)
	default:
		fmt.Fprintf(&b, "kolo run: rank %d on %s %s (the first rank to fail).\n", first.Slot.Rank, first.Slot.Host, first.Exit)
	}
	if by, rec, ok := Explaining(results, first, records); ok {
		fmt.Fprintf(&b, "Rank %d reported: %s\n", by, rec)
	}
	if len(first.StderrTail) > 0 {
		fmt.Fprintf(&b, "Last lines of rank %d's stderr:\n", first.Slot.Rank)
		for _, l := range first.StderrTail {
			fmt.Fprintf(&b, "    %s\n", l)
		}
	}
	var others []string
	for i := range results {
		r := &results[i]
		if r == first {
			continue
		}
		how := r.Exit.String()
		if r.Stopped {
			how = "stopped by the launcher (" + how + ")"
		}
		if rec, ok := records[r.Slot.Rank]; ok {
			how += " (" + string(rec.Kind)
			if !rec.Own() {
				how += fmt.Sprintf(", blames rank %d", rec.Blames)
			}
			how += ")"
		}
		others = append(others, fmt.Sprintf("rank %d on %s: %s", r.Slot.Rank, r.Slot.Host, how))
	}
	if len(others) > 0 {
		fmt.Fprintf(&b, "Other ranks: %s\n", strings.Join(others, "; "))
	}
	return b.String()
}

// Explaining returns the failure record that says why first failed, and the rank that sent it: its
// own in its words, else the record of the lowest rank that names it (first may have sent none, or
// one of what followed: an early end's shutdown that lost the others). Summary quotes it, and
// kolo run's outcome file carries it.
func Explaining(results []Result, first *Result, records map[int]report.Failure) (by int, rec report.Failure, ok bool) {
	own, ok := records[first.Slot.Rank]
	if !ok || !own.Own() {
		for _, r := range results { // results are in rank order: the lowest rank that names first
			if rec, named := records[r.Slot.Rank]; named && !rec.Own() && rec.Blames == first.Slot.Rank {
				return r.Slot.Rank, rec, true
			}
		}
	}
	return first.Slot.Rank, own, ok
}
