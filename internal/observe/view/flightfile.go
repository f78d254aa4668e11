package view

import (
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/kolo-dl/kolo/internal/observe/flight"
	"github.com/kolo-dl/kolo/internal/observe/report"
)

// FlightFile is what the launcher writes when ops stall or the job fails: every rank's flight
// record, as full as it has it, so the failure can be read after the job is gone.
type FlightFile struct {
	Reason string       `json:"reason"`
	Time   time.Time    `json:"time"` // the launcher's clock
	Size   int          `json:"size"`
	Ranks  []RankFlight `json:"ranks"`
}

// RankFlight is one rank's record. Ops is the rank's whole ring when it sent it (on a stall or a
// failure it does), else the tail its last report carried.
type RankFlight struct {
	Rank int    `json:"rank"`
	Host string `json:"host,omitempty"`
	// Reported is when the launcher last heard from the rank (zero: never).
	Reported time.Time   `json:"reported,omitzero"`
	Full     bool        `json:"full"` // Ops is the whole ring, not a report's tail
	Total    uint64      `json:"total,omitempty"`
	Ops      []flight.Op `json:"ops"`
	// Figures are the end table's row, from the rank's last report (nil: it never reported).
	Figures *Figures `json:"figures,omitempty"`
}

// Figures is a rank's row of the end table, in seconds and bytes.
type Figures struct {
	Steps         uint64   `json:"steps"`
	StepMedian    float64  `json:"step_median_s"`
	StepP95       float64  `json:"step_p95_s"`
	Lateness      *float64 `json:"lateness_s,omitempty"` // nil: rank 0 never named it
	InCollectives float64  `json:"in_collectives_s"`
	Up            float64  `json:"up_s"`
	BytesReduced  uint64   `json:"bytes_reduced"`
	OpsDone       uint64   `json:"ops_done"`
	OpsFailed     uint64   `json:"ops_failed"`
}

// FlightFile assembles the file's content: flights holds the whole rings the ranks sent (by rank;
// missing or nil entries fall back to the reports' tails).
func (s *State) FlightFile(now time.Time, reason string, flights map[int]*flight.Snapshot) FlightFile {
	f := FlightFile{Reason: reason, Time: now, Size: s.size, Ranks: make([]RankFlight, 0, s.size)}
	for rank, r := range s.reports {
		rf := RankFlight{Rank: rank, Ops: []flight.Op{}}
		if r != nil {
			rf.Host, rf.Reported = r.Host, s.received[rank]
			fig := &Figures{Steps: r.Steps, StepMedian: r.StepMedian.Seconds(), StepP95: r.StepP95.Seconds(),
				InCollectives: r.InCollectives.Seconds(), Up: r.Up.Seconds(), BytesReduced: r.BytesReduced,
				OpsDone: r.OpsDone, OpsFailed: r.OpsFailed}
			if l, ok := s.Lateness(rank); ok {
				sec := l.Seconds()
				fig.Lateness = &sec
			}
			rf.Figures = fig
		}
		if snap := flights[rank]; snap != nil {
			rf.Full, rf.Total, rf.Ops = true, snap.Total, snap.Ops
		} else if r != nil {
			for _, o := range r.Last {
				rf.Ops = append(rf.Ops, toFlight(o))
			}
			if r.Current != nil {
				rf.Ops = append(rf.Ops, toFlight(*r.Current))
			}
		}
		f.Ranks = append(f.Ranks, rf)
	}
	return f
}

func toFlight(o report.Op) flight.Op {
	return flight.Op{Name: o.Name, Kind: o.Kind, Bytes: o.Bytes, State: o.State, Submitted: o.Submitted,
		Negotiated: o.Negotiated, Started: o.Started, Finished: o.Finished}
}

// Write writes f as indented JSON.
func (f FlightFile) Write(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(f); err != nil {
		return fmt.Errorf("view: write flight record: %w", err)
	}
	return nil
}
