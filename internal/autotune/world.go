package autotune

import (
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/kolo-dl/kolo/internal/autotune/csvlog"
)

// World says which world a tuner ran in: its size and hosts, and in an elastic job its round. Every
// row of the log carries it, so that the rows of an elastic job's rounds, which rank 0 of each
// round appends to one log, tell apart, and a decision is read back only for a world like the one
// it was made in (DecisionFor).
type World struct {
	Round int // the elastic job's round (1, 2, ...); 0 outside elastic jobs
	Ranks int // ranks in the world; 0: not known
	Hosts int // hosts they run on; 0: not known
}

// Columns of the world in the log.
const (
	ColumnRound = "round"
	ColumnRanks = "ranks"
	ColumnHosts = "hosts"
)

// String reads like "round 2, 2 ranks on 1 host", or "3 ranks on 2 hosts" outside elastic jobs.
func (w World) String() string {
	s := plural(w.Ranks, "rank") + " on " + plural(w.Hosts, "host")
	if w.Round > 0 {
		s = "round " + strconv.Itoa(w.Round) + ", " + s
	}
	return s
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return strconv.Itoa(n) + " " + what + "s"
}

// Similar says a decision made in world w holds in world o: the same number of ranks on the same
// number of hosts, which sets the step's computation per rank, the bytes each allreduce moves and
// the links (shared memory, TCP) it crosses. A side that does not know its size (0) matches any.
func (w World) Similar(o World) bool {
	same := func(a, b int) bool { return a == 0 || b == 0 || a == b }
	return same(w.Ranks, o.Ranks) && same(w.Hosts, o.Hosts)
}

// worldOf reads a row's world; a log written before these columns existed has none, which reads as
// a world of unknown size (it matches any).
func worldOf(cols map[string]string) (World, error) {
	var w World
	for _, f := range []struct {
		col string
		dst *int
	}{{ColumnRound, &w.Round}, {ColumnRanks, &w.Ranks}, {ColumnHosts, &w.Hosts}} {
		v, ok := cols[f.col]
		if !ok || v == "" {
			continue
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return World{}, fmt.Errorf("autotune: %s %q: want a whole number >= 0", f.col, v)
		}
		*f.dst = n
	}
	return w, nil
}

// ErrNoDecisionForWorld says a log holds decisions, none for a world like the one asked about.
var ErrNoDecisionForWorld = errors.New("autotune: the log's decisions are all for other worlds")

// DecisionFor is the last decision in l made in a world Similar to w, with the world it was made
// in. It returns csvlog.ErrNoDecision when the log has no decision at all, ErrNoDecisionForWorld
// when it has some, for other worlds only.
func DecisionFor(l *csvlog.Log, w World) (Settings, World, error) {
	found := false
	for i := len(l.Rows) - 1; i >= 0; i-- {
		row := l.Rows[i]
		if row.Role != csvlog.Chosen {
			continue
		}
		found = true
		rw, err := worldOf(row.Settings)
		if err != nil {
			return Settings{}, World{}, err
		}
		if !rw.Similar(w) {
			continue
		}
		s, err := ParseSettings(row.Settings)
		return s, rw, err
	}
	if found {
		return Settings{}, World{}, ErrNoDecisionForWorld
	}
	return Settings{}, World{}, csvlog.ErrNoDecision
}

// CanAppend says a tuner can append its rows to l (Config.AppendLog): its columns are the ones a
// tuner writes.
func CanAppend(l *csvlog.Log) bool { return slices.Equal(l.Settings, logColumns) }
