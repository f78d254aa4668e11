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
	"context"
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
	waiters map[string]map[*waiter]struct{} // parked Gets, by key
	closed  bool
}

// waiter is one parked Get. fire is called exactly once, outside the store's lock, with the value
// or with ErrClosed; it must not block.
type waiter struct {
	fire func(val []byte, err error)
}

// NewStore returns an empty store.
func NewStore() *Store {
	return &Store{vals: map[string][]byte{}, waiters: map[string]map[*waiter]struct{}{}}
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
	if v, ok := s.vals[key]; ok {
		return v, true, nil, nil
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
	}, nil
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
