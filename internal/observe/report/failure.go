package report

import (
	"encoding/json"
	"fmt"
	"strconv"
)

// Failure is what a rank tells the launcher when it fails: which rank, how, the rank it blames if
// any, and why, from the typed error where it is known (the engine's, or the script's exception).
// The launcher names the rank behind a job's failure from these records, never from stderr.
type Failure struct {
	Rank int    `json:"rank"` // the rank that failed, as the launcher numbers it
	Host string `json:"host"`
	Kind Kind   `json:"kind"`
	// Blames is the rank this failure traces back to (as the launcher numbers it): the peer lost,
	// stuck, ended early or that failed first and told this one; -1 when none (the rank's own).
	Blames  int    `json:"blames"`
	Op      string `json:"op,omitempty"` // the op it failed in, if any
	Message string `json:"message"`
	// Round is the elastic round the rank failed in (its Rank and Blames are that round's); 0 in
	// a job that is not elastic.
	Round int `json:"round,omitempty"`
}

// Kind is how a rank failed.
type Kind string

const (
	// KindException: the rank's program raised (Python) or gave up (kolo.Abort): its own failure.
	KindException Kind = "exception"
	// KindLost: a peer's process or connection went away.
	KindLost Kind = "lost"
	// KindStalled: a peer made no progress for the progress deadline (stopped, hung, cut off).
	KindStalled Kind = "stalled"
	// KindEnded: a peer reached shutdown (its program finished) while this rank still needed it.
	KindEnded Kind = "ended"
	// KindPeerFailed: a peer failed and told this rank why (its abort notice).
	KindPeerFailed Kind = "peer failed"
	// KindOp: an op failed by negotiation (ranks disagreed), no rank to blame.
	KindOp Kind = "op error"
	// KindError: any other error of the rank's engine.
	KindError Kind = "error"
)

var kinds = map[Kind]bool{KindException: true, KindLost: true, KindStalled: true, KindEnded: true,
	KindPeerFailed: true, KindOp: true, KindError: true}

// Own reports whether the failure is the rank's own (it blames no other rank).
func (f Failure) Own() bool { return f.Blames < 0 || f.Blames == f.Rank }

// FailureKey is where the process the launcher started as rank (or, in an elastic job, at place
// "host[slot]") publishes its Failure; world is the launcher's job id.
func FailureKey(world, who string) string { return "observe/" + world + "/failure/" + who }

// RankName is who FailureKey names for the rank of a static job.
func RankName(rank int) string { return strconv.Itoa(rank) }

// MaxFailureMessage bounds a record's message: an exception's text may be megabytes.
const MaxFailureMessage = 4 << 10

// EncodeFailure returns f's bytes, its message capped at MaxFailureMessage.
func EncodeFailure(f Failure) []byte {
	if len(f.Message) > MaxFailureMessage {
		f.Message = f.Message[:MaxFailureMessage] + " [...]"
	}
	b, _ := json.Marshal(f) // plain strings and ints: cannot fail
	return b
}

// DecodeFailure reads a record EncodeFailure wrote, checking what the launcher relies on.
func DecodeFailure(b []byte) (Failure, error) {
	var f Failure
	if err := json.Unmarshal(b, &f); err != nil {
		return Failure{}, fmt.Errorf("%w: failure record: %v", ErrMalformed, err)
	}
	switch {
	case !kinds[f.Kind]:
		return Failure{}, fmt.Errorf("%w: failure record of unknown kind %q", ErrMalformed, f.Kind)
	case f.Rank < 0 || f.Blames < -1:
		return Failure{}, fmt.Errorf("%w: failure record of rank %d blaming rank %d", ErrMalformed, f.Rank, f.Blames)
	}
	return f, nil
}

// String is the record in one line, as the launcher's summary quotes it.
func (f Failure) String() string {
	s := string(f.Kind)
	if !f.Own() {
		s += fmt.Sprintf(" (blames rank %d)", f.Blames)
	}
	return s + ": " + f.Message
}
