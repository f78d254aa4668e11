// Package timeline records what kolo's engine does to each tensor as a Chrome trace (the JSON
// array format that chrome://tracing and Perfetto load), like Horovod's HOROVOD_TIMELINE: one row
// per tensor, with the phases NEGOTIATE_<OP> (from the first rank's submission until every rank has
// it, with an instant per rank as it submits), then <OP> (ALLREDUCE, ...) containing QUEUE (decided,
// waiting its turn to run), MEMCPY_IN_FUSION_BUFFER, the collective itself (KOLO_<OP>) and
// MEMCPY_OUT_FUSION_BUFFER; optionally a CYCLE_START marker per engine cycle.
//
// Recording is cheap: a call takes a timestamp and appends a small record under a mutex; a
// goroutine turns records into JSON and writes them every flushEvery, rewriting the closing
// bracket each time, so the file is a complete JSON array after every write, also when the process
// is killed later. It must not know about the engine's types: callers pass names and strings.
package timeline

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// flushEvery is how often the writer goroutine writes what was recorded; a burst larger than
// flushBurst records wakes it sooner.
const (
	flushEvery = 100 * time.Millisecond
	flushBurst = 8192
)

// Timeline is one trace file being written. Its recording methods are safe for concurrent use and
// do nothing after Stop; a nil *Timeline must not be called (callers check, so that a disabled
// timeline costs one comparison).
type Timeline struct {
	path       string
	markCycles bool
	start      time.Time

	mu      sync.Mutex
	recs    []record
	stopped bool

	wake chan struct{}
	stop chan struct{}
	done chan struct{}

	// Writer-owned.
	f    *os.File
	off  int64 // where the next event goes: just before the closing bracket
	n    int   // events written
	rows map[rowKey]*row
	out  bytes.Buffer
	err  error
}

type recKind uint8

const (
	recSubmitted recKind = iota + 1
	recNegotiated
	recActivity
	recDone
	recCycle
	recMark
)

// record is one call, kept until the writer formats it. names is shared with the caller, who must
// not change it afterwards (the engine passes a response's names, which are never modified).
type record struct {
	kind  recKind
	set   int
	rank  int
	name  string   // one tensor (Submitted)
	names []string // several (the others)
	what  string   // op kind or activity
	ts    time.Duration
}

type rowKey struct {
	set  int
	name string
}

// row is one tensor's line in the trace and which of its spans are open.
type row struct {
	pid                         int
	negotiating, op, inActivity bool
}

// Start creates (or truncates) the trace file at path and starts recording. markCycles adds a
// CYCLE_START marker for each call to Cycle.
func Start(path string, markCycles bool) (*Timeline, error) {
	if path == "" {
		return nil, errors.New("timeline: no file path")
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("timeline: %w", err)
	}
	t := &Timeline{path: path, markCycles: markCycles, start: time.Now(), f: f, rows: map[rowKey]*row{},
		wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	if _, err := f.WriteAt([]byte("[\n]\n"), 0); err != nil {
		f.Close()
		return nil, fmt.Errorf("timeline: write %s: %w", path, err)
	}
	t.off = 1
	go t.run()
	return t, nil
}

// Path is the file being written.
func (t *Timeline) Path() string { return t.path }

// MarkCycles reports whether Cycle records anything.
func (t *Timeline) MarkCycles() bool { return t.markCycles }

func (t *Timeline) add(r record) {
	r.ts = time.Since(t.start)
	t.mu.Lock()
	if t.stopped {
		t.mu.Unlock()
		return
	}
	t.recs = append(t.recs, r)
	burst := len(t.recs) == flushBurst
	t.mu.Unlock()
	if burst {
		select {
		case t.wake <- struct{}{}:
		default:
		}
	}
}

// Submitted records that rank submitted tensor name (of process set set) for an op of kind (as it
// should be shown: "ALLREDUCE"). The first submission opens the tensor's NEGOTIATE_<kind> span.
func (t *Timeline) Submitted(set int, name, kind string, rank int) {
	t.add(record{kind: recSubmitted, set: set, name: name, what: kind, rank: rank})
}

// Negotiated records that names were decided as one op of kind: their NEGOTIATE spans end, and
// <kind> and its QUEUE activity begin.
func (t *Timeline) Negotiated(set int, names []string, kind string) {
	t.add(record{kind: recNegotiated, set: set, names: names, what: kind})
}

// Activity ends the current activity of names' op and begins activity.
func (t *Timeline) Activity(set int, names []string, activity string) {
	t.add(record{kind: recActivity, set: set, names: names, what: activity})
}

// Done ends names' op (and its current activity).
func (t *Timeline) Done(set int, names []string) {
	t.add(record{kind: recDone, set: set, names: names})
}

// Mark records an instant event for the whole job, named label (the autotuner marks each change
// of settings). The label must need no JSON escaping: quotes and backslashes are dropped.
func (t *Timeline) Mark(label string) {
	label = strings.Map(func(r rune) rune {
		if r == '"' || r == '\\' || r < ' ' {
			return -1
		}
		return r
	}, label)
	t.add(record{kind: recMark, what: label})
}

// Cycle marks the start of an engine cycle, if MarkCycles.
func (t *Timeline) Cycle() {
	if t.markCycles {
		t.add(record{kind: recCycle})
	}
}

// Stop writes what is left, closes the array and the file. It may be called any number of times,
// from any goroutine, also while others record: every call returns once the file is complete, with
// the same error. Records that lose the race with Stop are dropped, never half-written.
func (t *Timeline) Stop() error {
	t.mu.Lock()
	first := !t.stopped
	t.stopped = true
	t.mu.Unlock()
	if first {
		close(t.stop)
	}
	<-t.done // the writer sets err before it closes done
	return t.err
}

func (t *Timeline) run() {
	defer close(t.done)
	tick := time.NewTicker(flushEvery)
	defer tick.Stop()
	var spare []record
	for {
		stopping := false
		select {
		case <-tick.C:
		case <-t.wake:
		case <-t.stop:
			stopping = true
		}
		t.mu.Lock()
		recs := t.recs
		t.recs = spare[:0]
		t.mu.Unlock()
		t.write(recs)
		clear(recs) // drop references to names
		spare = recs
		if stopping {
			if err := t.f.Close(); err != nil && t.err == nil {
				t.err = fmt.Errorf("timeline: close %s: %w", t.path, err)
			}
			return
		}
	}
}

// write formats recs and writes them over the closing bracket, followed by a new one.
func (t *Timeline) write(recs []record) {
	if len(recs) == 0 || t.err != nil {
		return
	}
	t.out.Reset()
	for i := range recs {
		t.format(&recs[i])
	}
	n := t.out.Len()
	t.out.WriteString("\n]\n")
	if _, err := t.f.WriteAt(t.out.Bytes(), t.off); err != nil {
		t.err = fmt.Errorf("timeline: write %s: %w", t.path, err)
		return
	}
	t.off += int64(n)
}

func (t *Timeline) row(set int, name string) *row {
	k := rowKey{set, name}
	if r := t.rows[k]; r != nil {
		return r
	}
	r := &row{pid: len(t.rows) + 1}
	t.rows[k] = r
	label := name
	if set != 0 {
		label = fmt.Sprintf("%s (process set %d)", name, set)
	}
	q, _ := json.Marshal(label)
	t.begin()
	fmt.Fprintf(&t.out, `{"name":"process_name","ph":"M","pid":%d,"args":{"name":%s}}`, r.pid, q)
	t.begin()
	fmt.Fprintf(&t.out, `{"name":"process_sort_index","ph":"M","pid":%d,"args":{"sort_index":%d}}`, r.pid, r.pid)
	return r
}

// begin separates events: the first follows "[" directly.
func (t *Timeline) begin() {
	if t.n > 0 {
		t.out.WriteString(",\n")
	} else {
		t.out.WriteString("\n")
	}
	t.n++
}

func (t *Timeline) event(ph byte, name string, pid int, ts time.Duration, extra string) {
	t.begin()
	b := t.out.AvailableBuffer()
	b = append(b, `{"ph":"`...)
	b = append(b, ph)
	b = append(b, '"')
	if name != "" {
		b = append(b, `,"name":"`...)
		b = append(b, name...) // activity names and ranks: nothing to escape
		b = append(b, '"')
	}
	b = append(b, `,"ts":`...)
	b = strconv.AppendFloat(b, float64(ts)/float64(time.Microsecond), 'f', 3, 64)
	b = append(b, `,"pid":`...)
	b = strconv.AppendInt(b, int64(pid), 10)
	b = append(b, `,"tid":0`...)
	b = append(b, extra...)
	b = append(b, '}')
	t.out.Write(b)
}

func (t *Timeline) format(r *record) {
	if r.kind == recCycle {
		t.event('i', "CYCLE_START", 0, r.ts, `,"s":"g"`)
		return
	}
	if r.kind == recMark {
		t.event('i', r.what, 0, r.ts, `,"s":"g"`)
		return
	}
	if r.kind == recSubmitted {
		w := t.row(r.set, r.name)
		if !w.negotiating {
			t.event('B', "NEGOTIATE_"+r.what, w.pid, r.ts, "")
			w.negotiating = true
		}
		t.event('i', "rank "+strconv.Itoa(r.rank), w.pid, r.ts, `,"s":"t"`)
		return
	}
	for _, name := range r.names {
		w := t.row(r.set, name)
		switch r.kind {
		case recNegotiated:
			if w.negotiating {
				t.event('E', "", w.pid, r.ts, "")
				w.negotiating = false
			}
			t.close(w, r.ts)
			t.event('B', r.what, w.pid, r.ts, "")
			t.event('B', "QUEUE", w.pid, r.ts, "")
			w.op, w.inActivity = true, true
		case recActivity:
			if !w.op {
				continue // recording started after this op was decided
			}
			if w.inActivity {
				t.event('E', "", w.pid, r.ts, "")
			}
			t.event('B', r.what, w.pid, r.ts, "")
			w.inActivity = true
		case recDone:
			if w.negotiating { // decided elsewhere (a process set without this rank)
				t.event('E', "", w.pid, r.ts, "")
				w.negotiating = false
			}
			t.close(w, r.ts)
		}
	}
}

// close ends w's open activity and op.
func (t *Timeline) close(w *row, ts time.Duration) {
	if w.inActivity {
		t.event('E', "", w.pid, ts, "")
	}
	if w.op {
		t.event('E', "", w.pid, ts, "")
	}
	w.op, w.inActivity = false, false
}
