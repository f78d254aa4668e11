// Package flight is a rank's flight recorder: a fixed-size ring of its last ops, each with when it
// was submitted, negotiated, started and finished, so that when a job stalls or fails the launcher
// can say what every rank was doing and had just done (torch.distributed's flight recorder, kolo's
// shape).
//
// The engine records on its hot path, so recording allocates nothing and takes one uncontended
// mutex: an op is recorded once, at submission, which returns an ID, and later moments are stamped
// by that ID. A reporter snapshots the ring from another goroutine; the snapshot copies the ring and
// is the only call that allocates. The package must not interpret what it records (no verdicts on
// stalls, no formatting for people) and must not grow: the ring's size is fixed at New.
package flight

import (
	"fmt"
	"sync"
	"time"
)

// State is how far an op got. The order is the order of an op's life.
type State uint8

const (
	Submitted  State = iota + 1 // queued on this rank and sent for negotiation
	Negotiated                  // every rank submitted it; rank 0 said to run it
	Started                     // its collective (perhaps fused with others) began
	Done                        // finished well
	Failed                      // finished with an error
)

var stateNames = [...]string{Submitted: "submitted", Negotiated: "negotiated", Started: "started", Done: "done", Failed: "failed"}

func (s State) String() string {
	if int(s) < len(stateNames) && s != 0 {
		return stateNames[s]
	}
	return "unknown"
}

// MarshalText writes the state's name, so the JSON file reads "negotiated", not 2.
func (s State) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText reads what MarshalText wrote ("unknown" is the zero State, an op record that
// lacks one).
func (s *State) UnmarshalText(b []byte) error {
	if string(b) == "unknown" {
		*s = 0
		return nil
	}
	for i, n := range stateNames {
		if n != "" && n == string(b) {
			*s = State(i)
			return nil
		}
	}
	return fmt.Errorf("flight: unknown op state %q", b)
}

// Finished reports whether the op is over, well or not.
func (s State) Finished() bool { return s == Done || s == Failed }

// Op is one recorded op. Kind and DType are names (the engine passes negotiate.OpKind.String and
// dtype.DType.String, which return constants: storing them allocates nothing).
type Op struct {
	Seq        uint64    `json:"seq"` // this rank's op number, from 1
	Name       string    `json:"name"`
	Kind       string    `json:"kind"`
	DType      string    `json:"dtype,omitempty"`
	Bytes      int64     `json:"bytes"`
	Set        int       `json:"set"` // process set id; 0 the global set
	State      State     `json:"state"`
	Submitted  time.Time `json:"submitted"`
	Negotiated time.Time `json:"negotiated,omitzero"`
	Started    time.Time `json:"started,omitzero"`
	Finished   time.Time `json:"finished,omitzero"`
}

// ID names a recorded op for the later stamps. The zero ID is never issued: stamping it is a no-op,
// so an engine entry that was never recorded (a recorder turned off) needs no special case.
type ID uint64

// Recorder is the ring. Its methods are safe for concurrent use.
type Recorder struct {
	mu   sync.Mutex
	ring []Op
	next uint64 // Seq of the next op
}

// New returns a recorder keeping the last n ops (n < 1 is taken as 1).
func New(n int) *Recorder {
	return &Recorder{ring: make([]Op, max(n, 1)), next: 1}
}

// Size is how many ops the ring keeps.
func (r *Recorder) Size() int { return len(r.ring) }

// Submit records a new op and returns its ID. It overwrites the oldest op once the ring is full.
func (r *Recorder) Submit(now time.Time, name, kind, dt string, bytes int64, set int) ID {
	r.mu.Lock()
	seq := r.next
	r.next++
	r.ring[seq%uint64(len(r.ring))] = Op{Seq: seq, Name: name, Kind: kind, DType: dt, Bytes: bytes, Set: set, State: Submitted, Submitted: now}
	r.mu.Unlock()
	return ID(seq)
}

// Negotiated stamps the moment rank 0's answer for the op arrived.
func (r *Recorder) Negotiated(id ID, now time.Time) { r.stamp(id, Negotiated, now) }

// Started stamps the moment the op's collective began.
func (r *Recorder) Started(id ID, now time.Time) { r.stamp(id, Started, now) }

// Finished stamps the op's end; failed says it ended with an error.
func (r *Recorder) Finished(id ID, now time.Time, failed bool) {
	if failed {
		r.stamp(id, Failed, now)
	} else {
		r.stamp(id, Done, now)
	}
}

// stamp moves the op forward to s. An op the ring has since overwritten is ignored, and so is a
// stamp that would move an op back (an error answered before the op ran is Finished without
// Started; a late Started must not reopen it).
func (r *Recorder) stamp(id ID, s State, now time.Time) {
	if id == 0 {
		return
	}
	r.mu.Lock()
	op := &r.ring[uint64(id)%uint64(len(r.ring))]
	if op.Seq == uint64(id) && op.State < s && !op.State.Finished() {
		op.State = s
		switch s {
		case Negotiated:
			op.Negotiated = now
		case Started:
			op.Started = now
		default:
			op.Finished = now
		}
	}
	r.mu.Unlock()
}

// Snapshot is the ring's content at one moment, oldest op first: a JSON-serialisable value.
type Snapshot struct {
	// Ops are the kept ops, oldest first.
	Ops []Op `json:"ops"`
	// Total is how many ops the rank recorded since New; Total - len(Ops) were overwritten.
	Total uint64 `json:"total"`
}

// Snapshot copies the ring.
func (r *Recorder) Snapshot() Snapshot {
	r.mu.Lock()
	defer r.mu.Unlock()
	total := r.next - 1
	n := min(total, uint64(len(r.ring)))
	s := Snapshot{Ops: make([]Op, 0, n), Total: total}
	for seq := r.next - n; seq < r.next; seq++ {
		s.Ops = append(s.Ops, r.ring[seq%uint64(len(r.ring))])
	}
	return s
}

// Current is the oldest op that has not finished: the one the rank is in (ops run in the order
// rank 0 answers them, and a rank's oldest open op is what its user code waits on first). ok is
// false when every kept op has finished.
func (s Snapshot) Current() (op Op, ok bool) {
	for _, o := range s.Ops {
		if !o.State.Finished() {
			return o, true
		}
	}
	return Op{}, false
}

// Open is how many kept ops have not finished.
func (s Snapshot) Open() int {
	n := 0
	for _, o := range s.Ops {
		if !o.State.Finished() {
			n++
		}
	}
	return n
}

// LastFinished is the op that finished last (by its Finished time; the latest Seq on a tie).
func (s Snapshot) LastFinished() (op Op, ok bool) {
	for _, o := range s.Ops {
		if o.State.Finished() && (!ok || !o.Finished.Before(op.Finished)) {
			op, ok = o, true
		}
	}
	return op, ok
}

// Tail is the last k kept ops, oldest first (fewer if fewer are kept).
func (s Snapshot) Tail(k int) []Op {
	if k < 0 {
		k = 0
	}
	return s.Ops[len(s.Ops)-min(k, len(s.Ops)):]
}
