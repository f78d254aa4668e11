package report

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/kolo-dl/kolo/internal/observe/flight"
)

// version is the first byte of an encoded Report: a launcher refuses what it cannot read rather
// than misread it.
const version = 1

// ErrMalformed is wrapped by every Decode error.
var ErrMalformed = errors.New("malformed report")

// Encode appends r's encoding to dst. Lists past the Max bounds are cut to them, and strings to
// MaxString bytes, so whatever Encode writes Decode reads.
func Encode(dst []byte, r *Report) []byte {
	w := writer{b: dst}
	w.byte(version)
	w.int(int64(r.Rank))
	w.str(r.Host)
	w.uint(r.Seq)
	w.time(r.At)
	w.int(int64(r.Up))
	w.uint(r.Steps)
	w.int(int64(r.StepMedian))
	w.int(int64(r.StepP95))
	w.int(int64(r.InCollectives))
	w.uint(r.BytesReduced)
	w.uint(r.OpsDone)
	w.uint(r.OpsFailed)
	kinds := r.OpLatency[:min(len(r.OpLatency), MaxKinds)]
	w.uint(uint64(len(kinds)))
	for i := range kinds {
		k := &kinds[i]
		w.str(k.Kind)
		for _, c := range k.Counts {
			w.uint(c)
		}
		w.int(int64(k.Sum))
	}
	if r.Current != nil {
		w.byte(1)
		w.op(r.Current)
	} else {
		w.byte(0)
	}
	w.int(int64(r.Open))
	last := r.Last[max(0, len(r.Last)-MaxLast):]
	w.uint(uint64(len(last)))
	for i := range last {
		w.op(&last[i])
	}
	if s := r.Straggle; s != nil {
		w.byte(1)
		w.str(s.Unit)
		w.int(int64(s.Samples))
		w.int(int64(s.Slowest))
		ranks := s.Ranks[:min(len(s.Ranks), MaxLate)]
		w.uint(uint64(len(ranks)))
		for _, l := range ranks {
			w.int(int64(l.Rank))
			w.int(int64(l.Last))
			w.int(int64(l.Lateness))
		}
		stalled := s.Stalled[:min(len(s.Stalled), MaxStalled)]
		w.uint(uint64(len(stalled)))
		for _, p := range stalled {
			w.str(p.Name)
			w.time(p.Since)
			w.int(int64(p.Arrived))
			missing := p.Missing[:min(len(p.Missing), MaxMissing)]
			w.uint(uint64(len(missing)))
			for _, m := range missing {
				w.int(int64(m))
			}
			w.int(int64(p.MissingCount))
		}
	} else {
		w.byte(0)
	}
	return w.b
}

// Decode reads one Report. It checks every length against the Max bounds before allocating, so
// a hostile or corrupt value costs at most their worth of memory.
func Decode(b []byte) (Report, error) {
	rd := reader{b: b}
	var r Report
	if v := rd.byte(); rd.err == nil && v != version {
		return r, fmt.Errorf("%w: version %d, want %d", ErrMalformed, v, version)
	}
	r.Rank = rd.intn("rank")
	r.Host = rd.str()
	r.Seq = rd.uint()
	r.At = rd.time()
	r.Up = time.Duration(rd.int())
	r.Steps = rd.uint()
	r.StepMedian = time.Duration(rd.int())
	r.StepP95 = time.Duration(rd.int())
	r.InCollectives = time.Duration(rd.int())
	r.BytesReduced = rd.uint()
	r.OpsDone = rd.uint()
	r.OpsFailed = rd.uint()
	if n := rd.count(MaxKinds, "kinds"); n > 0 {
		r.OpLatency = make([]KindLatency, n)
		for i := range r.OpLatency {
			k := &r.OpLatency[i]
			k.Kind = rd.str()
			for j := range k.Counts {
				k.Counts[j] = rd.uint()
			}
			k.Sum = time.Duration(rd.int())
		}
	}
	if rd.flag() {
		r.Current = new(Op)
		rd.op(r.Current)
	}
	r.Open = rd.intn("open")
	if n := rd.count(MaxLast, "last ops"); n > 0 {
		r.Last = make([]Op, n)
		for i := range r.Last {
			rd.op(&r.Last[i])
		}
	}
	if rd.flag() {
		s := &Straggle{}
		s.Unit = rd.str()
		s.Samples = rd.intn("samples")
		s.Slowest = rd.intn("slowest")
		if n := rd.count(MaxLate, "late ranks"); n > 0 {
			s.Ranks = make([]Late, n)
			for i := range s.Ranks {
				s.Ranks[i] = Late{Rank: rd.intn("rank"), Last: rd.intn("last"), Lateness: time.Duration(rd.int())}
			}
		}
		if n := rd.count(MaxStalled, "stalled ops"); n > 0 {
			s.Stalled = make([]Stalled, n)
			for i := range s.Stalled {
				p := &s.Stalled[i]
				p.Name = rd.str()
				p.Since = rd.time()
				p.Arrived = rd.intn("arrived")
				if m := rd.count(MaxMissing, "missing ranks"); m > 0 {
					p.Missing = make([]int, m)
					for j := range p.Missing {
						p.Missing[j] = rd.intn("missing rank")
					}
				}
				p.MissingCount = rd.intn("missing count")
			}
		}
		r.Straggle = s
	}
	if rd.err == nil && len(rd.b) > 0 {
		rd.fail("%d bytes after the report", len(rd.b))
	}
	if rd.err != nil {
		return Report{}, rd.err
	}
	return r, nil
}

type writer struct{ b []byte }

func (w *writer) byte(v byte)   { w.b = append(w.b, v) }
func (w *writer) uint(v uint64) { w.b = binary.AppendUvarint(w.b, v) }
func (w *writer) int(v int64)   { w.b = binary.AppendVarint(w.b, v) }
func (w *writer) str(s string) {
	s = s[:min(len(s), MaxString)]
	w.uint(uint64(len(s)))
	w.b = append(w.b, s...)
}
func (w *writer) time(t time.Time) {
	// The zero time is 0, not its (huge, negative) Unix nanoseconds, so it comes back as zero.
	if t.IsZero() {
		w.int(0)
		return
	}
	w.int(t.UnixNano())
}

func (w *writer) op(o *Op) {
	w.str(o.Name)
	w.str(o.Kind)
	w.int(o.Bytes)
	w.byte(byte(o.State))
	w.time(o.Submitted)
	w.time(o.Negotiated)
	w.time(o.Started)
	w.time(o.Finished)
}

// reader decodes; after the first error every read returns zero and the error stays.
type reader struct {
	b   []byte
	err error
}

func (r *reader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, args...))
	}
	r.b = nil
}

func (r *reader) byte() byte {
	if r.err != nil {
		return 0
	}
	if len(r.b) == 0 {
		r.fail("truncated")
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

func (r *reader) flag() bool {
	switch v := r.byte(); v {
	case 0, 1:
		return v == 1
	default:
		r.fail("flag byte %d", v)
		return false
	}
}

func (r *reader) uint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.fail("bad unsigned varint")
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) int() int64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.fail("bad varint")
		return 0
	}
	r.b = r.b[n:]
	return v
}

// intn reads an int that must fit 32 bits (ranks, counts): anything larger is corrupt.
func (r *reader) intn(what string) int {
	v := r.int()
	if v < -1<<31 || v >= 1<<31 {
		r.fail("%s %d out of range", what, v)
		return 0
	}
	return int(v)
}

func (r *reader) count(limit int, what string) int {
	v := r.uint()
	if v > uint64(limit) {
		r.fail("%d %s, at most %d", v, what, limit)
		return 0
	}
	return int(v)
}

func (r *reader) str() string {
	n := r.count(MaxString, "string bytes")
	if r.err != nil {
		return ""
	}
	if len(r.b) < n {
		r.fail("truncated string")
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s
}

func (r *reader) time() time.Time {
	v := r.int()
	if v == 0 {
		return time.Time{}
	}
	return time.Unix(0, v)
}

func (r *reader) op(o *Op) {
	o.Name = r.str()
	o.Kind = r.str()
	o.Bytes = r.int()
	s := flight.State(r.byte())
	if s > flight.Failed {
		r.fail("op state %d", s)
	}
	o.State = s
	o.Submitted = r.time()
	o.Negotiated = r.time()
	o.Started = r.time()
	o.Finished = r.time()
}
