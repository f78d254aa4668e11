package proc

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// culprit matches how kolo names the rank behind a failure in the errors every other rank reports:
// a transport.PeerError ("rank 1 on node0 lost during recv: ..."), the engine's other lost-peer
// error ("rank 1 (node0) lost: ..."), an abort notice from kolo.Abort and the Python exception
// hook ("rank 1 failed: ValueError: ...") or a progress deadline (transport.StallError: "rank 1
// (node0) made no progress for 1m0s ...").
var culprit = regexp.MustCompile(`\brank (\d+)(?: on \S+| \([^)]*\))? (lost during|lost:|failed: |made no progress)`)

// Blame returns the rank that the job's failure traces back to, starting from first (the earliest
// rank to fail). A rank that fails because another one did (its op reports that rank lost, or that
// rank's abort notice) can exit before that rank has been reaped, or before a remote node reports
// it; its own stderr names the culprit, and Blame follows that naming, rank by rank:
//   - to a rank that declared its own failure (an abort notice) and did not exit cleanly: it may
//     still have been winding down when the launcher stopped it; so too a rank named stuck (a
//     progress deadline), which the launcher finds alive, and stops;
//   - to a rank reported lost if it failed too, of something other than the launcher's stop
//     signal. One that exited cleanly (it left early, and the loss was its peers') is not to blame,
//     and one the launcher stopped was alive when the failure began.
//
// Without such a trail, first is the answer.
func Blame(results []Result, first *Result) *Result {
	if first == nil {
		return nil
	}
	byRank := make(map[int]*Result, len(results))
	for i := range results {
		byRank[results[i].Slot.Rank] = &results[i]
	}
	seen := map[int]bool{first.Slot.Rank: true}
	for {
		r, declared, ok := namedIn(first.StderrTail)
		if !ok || seen[r] {
			return first
		}
		next := byRank[r]
		if next == nil || !next.Exit.Failed() || (!declared && stoppedByLauncher(next)) {
			return first
		}
		seen[r] = true
		first = next
	}
}

// namedIn returns the rank named by the last kolo failure message in a stderr tail, and whether
// that rank declared its failure itself: the last line is the error the process left on; within
// it, the first match is the outermost cause.
func namedIn(tail []string) (rank int, declared, ok bool) {
	for i := len(tail) - 1; i >= 0; i-- {
		if m := culprit.FindStringSubmatch(tail[i]); m != nil {
			r, err := strconv.Atoi(m[1])
			return r, m[2] == "failed: " || m[2] == "made no progress", err == nil
		}
	}
	return 0, false, false
}

// stoppedByLauncher reports whether r ended of the launcher's own stop signal, so that its loss is
// a consequence of the failure rather than its cause.
func stoppedByLauncher(r *Result) bool {
	return r.Stopped && r.Exit.Signal == StopSignal
}

// Summary renders the report the launcher prints when a job fails: the first failing rank, its
// host, how it ended and its last stderr lines, then how every other rank ended.
func Summary(results []Result, first *Result) string {
	var b strings.Builder
	if first == nil {
		return ""
	}
	if first.Stopped {
		// Blame traced the failure to a rank that was still winding down when the launcher stopped it.
		fmt.Fprintf(&b, "kolo run: rank %d on %s failed first (then stopped by the launcher: %s).\n", first.Slot.Rank, first.Slot.Host, first.Exit)
	} else {
		fmt.Fprintf(&b, "kolo run: rank %d on %s %s (the first rank to fail).\n", first.Slot.Rank, first.Slot.Host, first.Exit)
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
		others = append(others, fmt.Sprintf("rank %d on %s: %s", r.Slot.Rank, r.Slot.Host, how))
	}
	if len(others) > 0 {
		fmt.Fprintf(&b, "Other ranks: %s\n", strings.Join(others, "; "))
	}
	return b.String()
}
