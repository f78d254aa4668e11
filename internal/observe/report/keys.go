package report

import (
	"strconv"
	"time"

	"github.com/kolo-dl/kolo/internal/observe/straggle"
)

// Keys in the rendezvous store. world names one world of the job (the JobID a world's records
// are kept under, new at every elastic re-form), so a re-formed world's ranks never overwrite the
// old one's reports and the launcher reads only the current world's.

// Key is where rank publishes its encoded Report (rendezvous Set, every Interval).
func Key(world string, rank int) string { return "observe/" + world + "/report/" + strconv.Itoa(rank) }

// FlightKey is where rank publishes its whole flight recorder (the JSON of a flight.Snapshot)
// when asked (DumpKey) or when it sees a stall or a failure of its own.
func FlightKey(world string, rank int) string {
	return "observe/" + world + "/flight/" + strconv.Itoa(rank)
}

// DumpKey is a counter the launcher adds 1 to when it wants every rank's whole flight recorder;
// a rank that reads a value above the last it answered publishes its FlightKey.
func DumpKey(world string) string { return "observe/" + world + "/dump" }

// StraggleOf takes rank 0's tracker figures for a report at now: every rank's lateness in a job of
// up to MaxLate ranks (the latest MaxLate beyond), and the ops waiting on ranks for warn or more.
func StraggleOf(t *straggle.Tracker, now time.Time, warn time.Duration) *Straggle {
	s := &Straggle{Unit: t.Unit(), Slowest: -1}
	if v, ok := t.Slowest(); ok {
		s.Slowest = v.Rank
	}
	for r := range t.Size() {
		st := t.Rank(r)
		s.Samples = st.Samples
		l := Late{Rank: r, Last: st.Last, Lateness: st.Lateness}
		if len(s.Ranks) < MaxLate {
			s.Ranks = append(s.Ranks, l)
		} else if l.Lateness > s.Ranks[len(s.Ranks)-1].Lateness {
			s.Ranks[len(s.Ranks)-1] = l
		} else {
			continue
		}
		// Keep the list latest first: one insertion step per rank.
		for i := len(s.Ranks) - 1; i > 0 && s.Ranks[i].Lateness > s.Ranks[i-1].Lateness; i-- {
			s.Ranks[i], s.Ranks[i-1] = s.Ranks[i-1], s.Ranks[i]
		}
	}
	for _, p := range t.Stalled(now, warn, MaxMissing) {
		if len(s.Stalled) == MaxStalled {
			break
		}
		s.Stalled = append(s.Stalled, Stalled{Name: p.Name, Since: p.Since, Arrived: p.Arrived, Missing: p.Missing, MissingCount: p.MissingCount})
	}
	return s
}
