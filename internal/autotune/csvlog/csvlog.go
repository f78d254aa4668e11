// Package csvlog writes and reads the autotuner's log: one CSV row per step-time sample, and a last
// row with the settings the tuner chose, which a later run can read back to start tuned.
//
// The log is for people as much as for programs, so its first line says what the numbers mean
// (seconds per step, lower is better) and every setting is a named column. Every row is flushed as
// it is written and the header at creation, so a job that ends during warm-up or mid-tuning still
// leaves a readable log, which then says there was no decision. The package formats and parses
// only: the caller opens, syncs and closes files.
package csvlog

import (
	"bufio"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Comment is the log's first line.
const Comment = "# kolo autotune log: step_time_s is seconds per optimizer step, lower is better; " +
	"speedup is defaults' time / this time"

// commentPrefix is what Read insists on, so that later wording changes still read.
const commentPrefix = "# kolo autotune log"

// Role says what a row is.
type Role string

const (
	Default   Role = "default"   // a sample of the default settings
	Candidate Role = "candidate" // a sample of settings being tried
	Chosen    Role = "chosen"    // the tuner's decision; the last row of a finished log
)

var fixedBefore = []string{"sample", "step"}
var fixedAfter = []string{"step_time_s", "role", "speedup", "ci_low", "ci_high"}

// Row is one row of the log. Floats that are not known (the speed-up of a defaults sample, the CI
// before there are enough pairs) are NaN and written as empty cells.
type Row struct {
	// Sample numbers the samples from 0; a Chosen row has none and reads back as -1.
	Sample int
	// Step is the training step at which the sample ended (or the decision was made).
	Step int64
	// Settings has a value for every setting the log was created with.
	Settings map[string]string
	// StepTime is seconds per step; a Chosen row may leave it NaN.
	StepTime float64
	Role     Role
	// Speedup, CILow and CIHigh are the defaults' time over this row's settings' time and its
	// confidence interval, as known when the row was written.
	Speedup, CILow, CIHigh float64
}

// Errors callers may branch on.
var (
	// ErrNoDecision says a log has no Chosen row: the job ended before tuning finished.
	ErrNoDecision = errors.New("csvlog: the log has no decision (the job ended before tuning finished)")
	ErrNotLog     = errors.New("csvlog: not a kolo autotune log")
)

// Writer appends rows to a log.
type Writer struct {
	w        *csv.Writer
	settings []string
}

// NewWriter writes the comment and the column header to w and returns a Writer for rows with the
// named settings, in that column order.
func NewWriter(w io.Writer, settings []string) (*Writer, error) {
	lw, err := AppendWriter(w, settings)
	if err != nil {
		return nil, err
	}
	if _, err := io.WriteString(w, Comment+"\n"); err != nil {
		return nil, fmt.Errorf("csvlog: write header: %w", err)
	}
	header := append(append(append([]string(nil), fixedBefore...), settings...), fixedAfter...)
	if err := lw.write(header); err != nil {
		return nil, fmt.Errorf("csvlog: write header: %w", err)
	}
	return lw, nil
}

// AppendWriter returns a Writer that appends rows with the named settings to a log w already holds
// (Read it, and check its Settings are these, first): it writes no header, so the log reads as
// one, its rows in file order. Rank 0 of each round of an elastic job appends its rows so.
func AppendWriter(w io.Writer, settings []string) (*Writer, error) {
	if err := checkNames(settings); err != nil {
		return nil, err
	}
	return &Writer{w: csv.NewWriter(w), settings: append([]string(nil), settings...)}, nil
}

func checkNames(settings []string) error {
	seen := map[string]bool{}
	for _, n := range append(append([]string(nil), fixedBefore...), fixedAfter...) {
		seen[n] = true
	}
	for _, n := range settings {
		if n == "" || strings.TrimSpace(n) != n {
			return fmt.Errorf("csvlog: setting name %q: empty or padded with spaces", n)
		}
		if seen[n] {
			return fmt.Errorf("csvlog: setting name %q used twice or taken by a fixed column", n)
		}
		seen[n] = true
	}
	return nil
}

func (lw *Writer) write(record []string) error {
	if err := lw.w.Write(record); err != nil {
		return err
	}
	lw.w.Flush()
	return lw.w.Error()
}

// Sample appends a Default or Candidate row.
func (lw *Writer) Sample(r Row) error {
	if r.Role != Default && r.Role != Candidate {
		return fmt.Errorf("csvlog: sample %d: role %q, want %q or %q", r.Sample, r.Role, Default, Candidate)
	}
	if r.Sample < 0 {
		return fmt.Errorf("csvlog: sample number %d is negative", r.Sample)
	}
	if !(r.StepTime > 0) || math.IsInf(r.StepTime, 0) {
		return fmt.Errorf("csvlog: sample %d: step time %g s is not positive and finite", r.Sample, r.StepTime)
	}
	return lw.row(strconv.Itoa(r.Sample), r)
}

// Chosen appends the decision: the settings kept or switched to, with the speed-up that justified
// them. r.Role and r.Sample are ignored.
func (lw *Writer) Chosen(r Row) error {
	r.Role = Chosen
	return lw.row("", r)
}

func (lw *Writer) row(sample string, r Row) error {
	if len(r.Settings) != len(lw.settings) {
		return fmt.Errorf("csvlog: %s row: %d settings, the log has %d (%s)",
			r.Role, len(r.Settings), len(lw.settings), strings.Join(lw.settings, ", "))
	}
	record := []string{sample, strconv.FormatInt(r.Step, 10)}
	for _, n := range lw.settings {
		v, ok := r.Settings[n]
		if !ok {
			return fmt.Errorf("csvlog: %s row: no value for setting %q", r.Role, n)
		}
		record = append(record, v)
	}
	record = append(record, formatFloat(r.StepTime), string(r.Role),
		formatFloat(r.Speedup), formatFloat(r.CILow), formatFloat(r.CIHigh))
	if err := lw.write(record); err != nil {
		return fmt.Errorf("csvlog: write %s row: %w", r.Role, err)
	}
	return nil
}

func formatFloat(v float64) string {
	if math.IsNaN(v) {
		return ""
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

func parseFloat(s string) (float64, error) {
	if s == "" {
		return math.NaN(), nil
	}
	return strconv.ParseFloat(s, 64)
}

// Log is a parsed log.
type Log struct {
	Settings []string // setting names, in column order
	Rows     []Row    // every row, Chosen ones included, in file order
}

// Read parses a log written by Writer.
func Read(r io.Reader) (*Log, error) {
	br := bufio.NewReader(r)
	first, err := br.ReadString('\n')
	if err != nil && !(errors.Is(err, io.EOF) && first != "") {
		return nil, fmt.Errorf("%w: reading the first line: %v", ErrNotLog, err)
	}
	if !strings.HasPrefix(first, commentPrefix) {
		return nil, fmt.Errorf("%w: first line %q", ErrNotLog, strings.TrimRight(first, "\r\n"))
	}
	cr := csv.NewReader(br)
	cr.Comment = '#'
	header, err := cr.Read()
	if err != nil {
		return nil, fmt.Errorf("%w: column header: %v", ErrNotLog, err)
	}
	nb, na := len(fixedBefore), len(fixedAfter)
	if len(header) < nb+na ||
		!slices.Equal(header[:nb], fixedBefore) || !slices.Equal(header[len(header)-na:], fixedAfter) {
		return nil, fmt.Errorf("%w: column header %q", ErrNotLog, header)
	}
	settings := header[nb : len(header)-na]
	if err := checkNames(settings); err != nil {
		return nil, fmt.Errorf("%w: column header: %v", ErrNotLog, err)
	}
	l := &Log{Settings: append([]string(nil), settings...)}
	for {
		record, err := cr.Read()
		if errors.Is(err, io.EOF) {
			return l, nil
		}
		if err != nil {
			return nil, fmt.Errorf("csvlog: %w", err)
		}
		line, _ := cr.FieldPos(0)
		row, err := parseRow(record, settings)
		if err != nil {
			return nil, fmt.Errorf("csvlog: line %d: %w", line, err)
		}
		l.Rows = append(l.Rows, row)
	}
}

func parseRow(record, settings []string) (Row, error) {
	nb := len(fixedBefore)
	tail := record[nb+len(settings):]
	row := Row{Sample: -1, Role: Role(tail[1]), Settings: make(map[string]string, len(settings))}
	switch row.Role {
	case Default, Candidate:
		n, err := strconv.Atoi(record[0])
		if err != nil || n < 0 {
			return Row{}, fmt.Errorf("sample number %q", record[0])
		}
		row.Sample = n
	case Chosen:
		if record[0] != "" {
			return Row{}, fmt.Errorf("chosen row has sample number %q", record[0])
		}
	default:
		return Row{}, fmt.Errorf("role %q", tail[1])
	}
	var err error
	if row.Step, err = strconv.ParseInt(record[1], 10, 64); err != nil {
		return Row{}, fmt.Errorf("step %q", record[1])
	}
	for i, n := range settings {
		row.Settings[n] = record[nb+i]
	}
	for _, f := range []struct {
		name string
		cell string
		dst  *float64
	}{
		{"step_time_s", tail[0], &row.StepTime},
		{"speedup", tail[2], &row.Speedup},
		{"ci_low", tail[3], &row.CILow},
		{"ci_high", tail[4], &row.CIHigh},
	} {
		if *f.dst, err = parseFloat(f.cell); err != nil {
			return Row{}, fmt.Errorf("%s %q", f.name, f.cell)
		}
	}
	if row.Role != Chosen && !(row.StepTime > 0 && !math.IsInf(row.StepTime, 0)) {
		return Row{}, fmt.Errorf("step_time_s %q: want a positive number of seconds", tail[0])
	}
	return row, nil
}
