package kolo

import (
	"time"

	"github.com/kolo-dl/kolo/internal/observe/flight"
	"github.com/kolo-dl/kolo/internal/observe/report"
)

// Stats is this rank's figures since Init, the ones its reports give kolo run's live view, end
// table and metrics: a script can log them or act on them without a launcher.
type Stats struct {
	Rank int
	// Up is how long the engine has run; Up - InCollectives is the time outside collectives.
	Up time.Duration
	// Steps counts MarkStep calls (the Python DistributedOptimizer's steps); StepMedian and StepP95
	// are over the last report.StepWindow steps (0 before two steps).
	Steps               uint64
	StepMedian, StepP95 time.Duration
	InCollectives       time.Duration
	BytesReduced        uint64
	OpsDone, OpsFailed  uint64
	// Lateness is, on rank 0 only (the rank whose coordinator sees every rank arrive), each
	// rank's median lateness over the straggler window: how long after the median of the others
	// it submits the same op. Nil on other ranks and before the window has samples.
	Lateness map[int]time.Duration
	// Slowest is the rank rank 0 names as the one the others wait for, -1 for none (and on other
	// ranks).
	Slowest int
}

// RankStats returns this rank's Stats now. It fails before Init.
func RankStats() (Stats, error) {
	s, err := get()
	if err != nil {
		return Stats{}, err
	}
	var r report.Report
	s.engine.Meter().Fill(&r, time.Now(), flight.Snapshot{})
	st := Stats{Rank: s.job.Rank, Up: r.Up, Steps: r.Steps, StepMedian: r.StepMedian, StepP95: r.StepP95,
		InCollectives: r.InCollectives, BytesReduced: r.BytesReduced, OpsDone: r.OpsDone, OpsFailed: r.OpsFailed, Slowest: -1}
	if g := s.engine.Straggle(); g != nil {
		st.Slowest = g.Slowest
		if len(g.Ranks) > 0 {
			st.Lateness = make(map[int]time.Duration, len(g.Ranks))
			for _, l := range g.Ranks {
				st.Lateness[l.Rank] = l.Lateness
			}
		}
	}
	return st, nil
}
