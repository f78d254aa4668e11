package launch

// The job's outcome as data (--outcome-file), one JSON document for the program that started kolo
// run (kolo.run in Python) to read instead of parsing the summary on stderr.

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/kolo-dl/kolo/internal/launch/elastic"
	"github.com/kolo-dl/kolo/internal/launch/layout"
	"github.com/kolo-dl/kolo/internal/launch/proc"
	"github.com/kolo-dl/kolo/internal/observe/report"
)

// Outcome is the document --outcome-file receives (docs/launcher.md, "The outcome file").
type Outcome struct {
	ExitCode    int           `json:"exit_code"` // kolo run's own exit status
	Succeeded   bool          `json:"succeeded"`
	Interrupted bool          `json:"interrupted"`     // Ctrl-C or SIGTERM stopped the job
	Error       string        `json:"error,omitempty"` // kolo run's own error ("kolo run: ..."), if any
	FirstFailed *RankOutcome  `json:"first_failed"`    // the rank the failure traces back to; nil: none failed
	Ranks       []RankOutcome `json:"ranks"`           // by rank; an elastic job lists its last round's
}

// RankOutcome is how one rank ended.
type RankOutcome struct {
	Rank     int    `json:"rank"`
	Host     string `json:"host"`
	ExitCode int    `json:"exit_code"`        // -1 when killed by a signal or never started
	Signal   int    `json:"signal,omitempty"` // the signal that killed it
	Stopped  bool   `json:"stopped,omitempty"`
	Error    string `json:"error,omitempty"` // it could not be started or waited for
	// Report is the failure record that says why it failed: in Ranks its own, in FirstFailed its
	// own or else that of the rank that names it (report.Failure.Rank says which sent it).
	Report *report.Failure `json:"report,omitempty"`
}

// rankOutcome is r's entry, with rec as its report when ok.
func rankOutcome(r proc.Result, rec report.Failure, ok bool) RankOutcome {
	o := RankOutcome{Rank: r.Slot.Rank, Host: r.Slot.Host, ExitCode: r.Exit.Code, Signal: int(r.Exit.Signal), Stopped: r.Stopped}
	if r.Exit.Err != nil {
		o.Error, o.ExitCode = r.Exit.Err.Error(), -1
	}
	if ok {
		o.Report = &rec
	}
	return o
}

// newOutcome is the outcome of a job that ended with code and err, its ranks yet to add.
func newOutcome(code int, err error, interrupted bool) Outcome {
	o := Outcome{ExitCode: code, Succeeded: code == 0 && err == nil, Interrupted: interrupted, Ranks: []RankOutcome{}}
	if err != nil {
		o.Error = err.Error()
	}
	return o
}

// staticOutcome is the outcome of a job of fixed ranks (from one machine, or without ssh): code and
// err are kolo run's, first the rank Blame traced the failure to (nil: none failed).
func staticOutcome(code int, err error, interrupted bool, results []proc.Result, first *proc.Result, records map[int]report.Failure) Outcome {
	o := newOutcome(code, err, interrupted)
	for _, r := range results {
		// A job that succeeded blames nobody, though a rank may have reported a failure it
		// recovered from.
		rec, ok := records[r.Slot.Rank]
		o.Ranks = append(o.Ranks, rankOutcome(r, rec, ok && first != nil))
	}
	if first != nil {
		_, rec, ok := proc.Explaining(results, first, records)
		f := rankOutcome(*first, rec, ok)
		o.FirstFailed = &f
	}
	return o
}

// finalOutcome is what --outcome-file gets when kolo run ends with code and err: whole, the
// job's own outcome, when it got far enough to have one; else how kolo run ended (input refused,
// the rendezvous lost), with no ranks.
func finalOutcome(code int, err error, interrupted bool, whole *Outcome) Outcome {
	if whole != nil {
		return *whole
	}
	return staticOutcome(code, err, interrupted, nil, nil, nil)
}

// writeOutcome writes o to path (none when path is empty) whole or not at all: a reader never
// sees half a document, nor one of an earlier job under the same name. A failure to write it is
// reported on stderr; it does not change how the job ended.
func writeOutcome(path string, o Outcome, stderr io.Writer) {
	if path == "" {
		return
	}
	if err := replaceFile(path, o); err != nil {
		fmt.Fprintf(stderr, "kolo run: --outcome-file: %v\n", err)
	}
}

func replaceFile(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	_, err = tmp.Write(append(b, '\n'))
	if err == nil {
		err = tmp.Chmod(0o644)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// outcome is the outcome of an elastic job that ended with code and err: how the workers of its
// last round (the one it finished training in, if it did) ended, by their rank in it, and, when
// it failed, the first worker of the failures that ended it, with its rank in the round it failed in.
func (j *elasticJob) outcome(code int, err error, interrupted bool) Outcome {
	o := newOutcome(code, err, interrupted)
	entry := func(p *elasticProc, rank int) RankOutcome {
		r := proc.Result{Slot: layout.Slot{Rank: rank, Host: p.place.Host}, Exit: p.exit, Stopped: p.stopped}
		if p.record != nil {
			return rankOutcome(r, *p.record, true)
		}
		return rankOutcome(r, report.Failure{}, false)
	}
	last := j.round
	if j.done != nil {
		last = *j.done
	}
	for i, k := range last.Ranks {
		if p := j.procs[elastic.Worker{Host: k.Host, Slot: k.Slot}]; p != nil && p.exited {
			o.Ranks = append(o.Ranks, entry(p, i))
		}
	}
	if code != 0 && !interrupted && len(j.lastBatch) > 0 {
		p := j.lastBatch[0]
		f := entry(p, p.rank)
		o.FirstFailed = &f
	}
	return o
}
