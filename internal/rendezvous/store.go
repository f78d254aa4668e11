// Package rendezvous is the authenticated key-value store a job's workers meet at: the launcher hosts a
// Server, every worker Dials it, publishes its listen address and reads its peers' (waiting until they
// appear), and uses atomic counters for barriers and for handing out slots, and SetIfAbsent for
// records that only the first of several writers may write.
//
// It is a meeting point, not a database or a transport: keys live in memory for the life of the job,
// values are small (at most MaxValue), nothing is persisted, and the store gives keys no meaning
// (callers namespace them). Every connection proves knowledge of the job secret (package auth) before
// any other byte, and a waiting Get parks on the server instead of polling it.
package rendezvous

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"
)

// ErrClosed is returned by calls on a closed Store, Server or Client.
var ErrClosed = errors.New("rendezvous closed")

// Store is the in-memory map the Server serves. The launcher uses it directly (in-process), workers
// through a Client. It is safe for concurrent use.
type Store struct {
	mu      sync.Mutex
	vals    map[string][]byte               // values are never mutated once stored: readers share them
	waiters map[string]map[*waiter]struct{} // parked Gets and Gathers, by key
	gathers map[string]*gathering           // by gather key
	closed  bool
}

// gathering is the state of one Gather key: how many members it waits for and which arrived.
type gathering struct {
	n    int
	have int
	vals [][]byte // by member index; nil until it arrives
}

// waiter is one parked Get. fire is called exactly once, outside the store's lock, with the value
// or with ErrClosed; it must not block.
type waiter struct {
	fire func(val []byte, err error)
}

// NewStore returns an empty store.
func NewStore() *Store {
	return &Store{vals: map[string][]byte{}, waiters: map[string]map[*waiter]struct{}{}, gathers: map[string]*gathering{}}
}

// Set stores a copy of value under key and wakes every Get waiting for it.
func (s *Store) Set(key string, value []byte) error {
	if err := checkSizes(key, value); err != nil {
		return fmt.Errorf("rendezvous set: %w", err)
	}
	return s.set(key, append([]byte(nil), value...))
}

// storeAndUnlock stores value under key, releases s.mu (which the caller holds) and wakes the
// key's waiters; they are woken outside the lock, as their callbacks may call back into s.
func (s *Store) storeAndUnlock(key string, value []byte) {
	s.vals[key] = value
	ws := s.waiters[key]
	delete(s.waiters, key)
	s.mu.Unlock()
	for w := range ws {
		w.fire(value, nil)
	}
}

// set takes ownership of value.
func (s *Store) set(key string, value []byte) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return fmt.Errorf("rendezvous set %q: %w", key, ErrClosed)
	}
	s.storeAndUnlock(key, value)
	return nil
}

// SetIfAbsent stores a copy of value under key only if key is not set, and reports whether it did.
// Of callers racing to set a key this way exactly one wins, and every Get sees the winner's value:
// the store's one compare-and-set, for records that must be written once (a later Set would still
// replace it; callers that need write-once use SetIfAbsent for every write of the key).
func (s *Store) SetIfAbsent(key string, value []byte) (stored bool, err error) {
	if err := checkSizes(key, value); err != nil {
		return false, fmt.Errorf("rendezvous setifabsent: %w", err)
	}
	value = append([]byte(nil), value...)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return false, fmt.Errorf("rendezvous setifabsent %q: %w", key, ErrClosed)
	}
	if _, ok := s.vals[key]; ok {
		s.mu.Unlock()
		return false, nil
	}
	s.storeAndUnlock(key, value)
	return true, nil
}

// deleteIf removes key if it still holds value (a session's record that no later writer
// replaced), and reports whether it did.
func (s *Store) deleteIf(key string, value []byte) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if v, ok := s.vals[key]; ok && !s.closed && bytes.Equal(v, value) {
		delete(s.vals, key)
		return true
	}
	return false
}

// TryGet returns a copy of key's value, or ok false if it is not set.
func (s *Store) TryGet(key string) (value []byte, ok bool, err error) {
	v, ok, err := s.peek(key)
	if !ok || err != nil {
		return nil, ok, err
	}
	return append([]byte{}, v...), true, nil
}

func (s *Store) peek(key string) ([]byte, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, false, fmt.Errorf("rendezvous get %q: %w", key, ErrClosed)
	}
	v, ok := s.vals[key]
	return v, ok, nil
}

// Get returns a copy of key's value, waiting until some caller sets it or ctx ends.
func (s *Store) Get(ctx context.Context, key string) ([]byte, error) {
	start := time.Now()
	ch := make(chan getResult, 1)
	v, ok, cancel, err := s.wait(key, func(val []byte, err error) { ch <- getResult{val, err} })
	if err != nil {
		return nil, err
	}
	if ok {
		return append([]byte{}, v...), nil
	}
	select {
	case r := <-ch:
		if r.err != nil {
			return nil, fmt.Errorf("rendezvous get %q: %w", key, r.err)
		}
		return append([]byte{}, r.val...), nil
	case <-ctx.Done():
		if !cancel() {
			// It fired while we were giving up: the value is there, take it.
			if r := <-ch; r.err == nil {
				return append([]byte{}, r.val...), nil
			}
		}
		return nil, fmt.Errorf("rendezvous: waited %s for key %q: %w", time.Since(start).Round(time.Millisecond), key, ctx.Err())
	}
}

type getResult struct {
	val []byte
	err error
}

// wait returns key's value if it is set; otherwise it parks fire until it is (or the store closes)
// and returns cancel, which unparks it and reports whether it did so before fire was called.
func (s *Store) wait(key string, fire func([]byte, error)) (val []byte, ok bool, cancel func() bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, false, nil, fmt.Errorf("rendezvous get %q: %w", key, ErrClosed)
	}
	val, ok, cancel = s.parkLocked(key, fire)
	return val, ok, cancel, nil
}

// parkLocked is wait with s.mu held and the store open.
func (s *Store) parkLocked(key string, fire func([]byte, error)) (val []byte, ok bool, cancel func() bool) {
	if v, ok := s.vals[key]; ok {
		return v, true, nil
	}
	w := &waiter{fire: fire}
	ws := s.waiters[key]
	if ws == nil {
		ws = map[*waiter]struct{}{}
		s.waiters[key] = ws
	}
	ws[w] = struct{}{}
	return nil, false, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		ws := s.waiters[key]
		if _, parked := ws[w]; !parked {
			return false
		}
		delete(ws, w)
		if len(ws) == 0 {
			delete(s.waiters, key)
		}
		return true
	}
}

// Add adds delta to the counter at key (a missing key counts as 0) and returns the new value. A
// counter is stored as its decimal text, so Get of a counter key reads "3"; Add on a key holding
// anything else fails.
func (s *Store) Add(key string, delta int64) (int64, error) {
	if err := checkSizes(key, nil); err != nil {
		return 0, fmt.Errorf("rendezvous add: %w", err)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return 0, fmt.Errorf("rendezvous add %q: %w", key, ErrClosed)
	}
	var cur int64
	if v, ok := s.vals[key]; ok {
		n, err := strconv.ParseInt(string(v), 10, 64)
		if err != nil {
			s.mu.Unlock()
			return 0, fmt.Errorf("rendezvous add %q: key holds %q, not a counter", key, truncate(v))
		}
		cur = n
	}
	next := cur + delta
	val := strconv.AppendInt(nil, next, 10)
	s.storeAndUnlock(key, val)
	return next, nil
}

func truncate(v []byte) string {
	if len(v) > 32 {
		return string(v[:32]) + "..."
	}
	return string(v)
}

// Close fails every parked Get and every later call with ErrClosed.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	all := s.waiters
	s.waiters = map[string]map[*waiter]struct{}{}
	s.mu.Unlock()
	for _, ws := range all {
		for w := range ws {
			w.fire(nil, ErrClosed)
		}
	}
	return nil
}

// Gather is an all-gather of small records in one request per member: member i of n stores value
// under key/i (where a Get of that key finds it too) and, once all n members have, every member
// gets all n values in member order. The complete table is also stored under key, encoded as
// EncodeTable does. It replaces n Gets per member (n² requests for the job) with one; a member
// may repeat its request with the same value (a retry), but not with another value or another n.
func (s *Store) Gather(ctx context.Context, key string, n, i int, value []byte) ([][]byte, error) {
	start := time.Now()
	ch := make(chan getResult, 1)
	table, ok, cancel, wake, err := s.gather(key, n, i, value, func(val []byte, err error) { ch <- getResult{val, err} })
	if err != nil {
		return nil, err
	}
	wake()
	if !ok {
		select {
		case r := <-ch:
			if r.err != nil {
				return nil, fmt.Errorf("rendezvous gather %q: %w", key, r.err)
			}
			table = r.val
		case <-ctx.Done():
			if cancel() {
				return nil, fmt.Errorf("rendezvous: waited %s for the %d members of gather %q: %w", time.Since(start).Round(time.Millisecond), n, key, ctx.Err())
			}
			r := <-ch // it fired while we were giving up
			if r.err != nil {
				return nil, fmt.Errorf("rendezvous gather %q: %w", key, r.err)
			}
			table = r.val
		}
	}
	return DecodeTable(table, n)
}

// gather records member i's value and returns the encoded table if every member has arrived;
// otherwise it parks fire until they have (as wait does). The caller must call wake (never nil
// without an error) once it holds no lock that a waiter's fire takes: this member may be the one
// that completes the gather, and the members parked on it, perhaps on the caller's own
// connection, are woken then.
func (s *Store) gather(key string, n, i int, value []byte, fire func([]byte, error)) (table []byte, ok bool, cancel func() bool, wake func(), err error) {
	member := key + "/" + strconv.Itoa(i)
	if err := checkSizes(member, value); err != nil {
		return nil, false, nil, nil, fmt.Errorf("rendezvous gather: %w", err)
	}
	if n < 1 || n > maxGather || i < 0 || i >= n {
		return nil, false, nil, nil, fmt.Errorf("rendezvous gather %q: member %d of %d is out of range (at most %d members)", key, i, n, maxGather)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, false, nil, nil, fmt.Errorf("rendezvous gather %q: %w", key, ErrClosed)
	}
	g := s.gathers[key]
	if g == nil {
		g = &gathering{n: n, vals: make([][]byte, n)}
		s.gathers[key] = g
	}
	switch {
	case g.n != n:
		s.mu.Unlock()
		return nil, false, nil, nil, fmt.Errorf("rendezvous gather %q: member %d says %d members, %s %d: %w", key, i, n, gatherMismatch, g.n, ErrGatherMismatch)
	case g.vals[i] != nil && !bytes.Equal(g.vals[i], value):
		s.mu.Unlock()
		return nil, false, nil, nil, fmt.Errorf("rendezvous gather %q: member %d arrived twice with different values (two processes claim the same rank?)", key, i)
	case g.vals[i] == nil:
		v := append([]byte{}, value...) // non-nil even when empty: nil marks a member not yet arrived
		g.vals[i] = v
		g.have++
		s.vals[member] = v
		mine := s.waiters[member]
		delete(s.waiters, member)
		var all map[*waiter]struct{}
		if g.have == n {
			table = EncodeTable(g.vals)
			if len(table) > MaxValue {
				s.mu.Unlock()
				return nil, false, nil, nil, fmt.Errorf("rendezvous gather %q: the table of %d members is %d bytes, more than the %d allowed", key, n, len(table), MaxValue)
			}
			s.vals[key] = table
			all = s.waiters[key]
			delete(s.waiters, key)
		}
		if table == nil {
			_, _, cancel = s.parkLocked(key, fire)
		}
		s.mu.Unlock()
		wake = func() {
			for w := range mine {
				w.fire(v, nil)
			}
			for w := range all {
				w.fire(table, nil)
			}
		}
		return table, table != nil, cancel, wake, nil
	}
	table, ok, cancel = s.parkLocked(key, fire)
	s.mu.Unlock()
	return table, ok, cancel, func() {}, nil
}

// ErrGatherMismatch is matched by the error of a Gather member that disagrees with the earlier
// members on how many members there are (a job's ranks or nodes started with different sizes).
var ErrGatherMismatch = errors.New("the members of a gather disagree on their number")

// gatherMismatch is the text by which a Client recognises that error in the server's answer.
const gatherMismatch = "an earlier one said"

// maxGather bounds the members of one Gather, so that a bad request cannot make the server
// allocate a huge table.
const maxGather = 1 << 20

// EncodeTable encodes a Gather's values: for each, a big-endian u32 length and the bytes.
func EncodeTable(vals [][]byte) []byte {
	size := 0
	for _, v := range vals {
		size += 4 + len(v)
	}
	out := make([]byte, 0, size)
	for _, v := range vals {
		out = binary.BigEndian.AppendUint32(out, uint32(len(v)))
		out = append(out, v...)
	}
	return out
}

// DecodeTable decodes what EncodeTable wrote, expecting n values.
func DecodeTable(b []byte, n int) ([][]byte, error) {
	vals := make([][]byte, 0, n)
	for len(b) > 0 {
		if len(b) < 4 {
			return nil, fmt.Errorf("rendezvous gather table: %d stray bytes after %d values", len(b), len(vals))
		}
		l := int(binary.BigEndian.Uint32(b))
		if l > len(b)-4 {
			return nil, fmt.Errorf("rendezvous gather table: value %d of %d bytes, but only %d follow", len(vals), l, len(b)-4)
		}
		vals = append(vals, b[4:4+l:4+l])
		b = b[4+l:]
	}
	if len(vals) != n {
		return nil, fmt.Errorf("rendezvous gather table: %d values, want %d", len(vals), n)
	}
	return vals, nil
}
