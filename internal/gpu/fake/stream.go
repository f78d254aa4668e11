package fake

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/kolo-dl/kolo/internal/gpu"
)

var errDestroyed = errors.New("fake stream destroyed")

// Stream runs its work in order on its own goroutine.
type Stream struct {
	dev *Device

	mu        sync.Mutex
	queue     []func()
	enqueued  uint64
	done      uint64
	progress  chan struct{} // closed and replaced whenever done advances
	wake      chan struct{}
	destroyed bool
}

func newStream(d *Device, run bool) *Stream {
	s := &Stream{dev: d, progress: make(chan struct{}), wake: make(chan struct{}, 1)}
	if run {
		go s.run()
	}
	return s
}

// Handle is the stream's handle, what WrapStream takes.
func (s *Stream) Handle() uintptr { return uintptr(unsafe.Pointer(s)) }

func (s *Stream) run() {
	for {
		s.mu.Lock()
		for len(s.queue) == 0 {
			if s.destroyed {
				s.mu.Unlock()
				return
			}
			s.mu.Unlock()
			<-s.wake
			s.mu.Lock()
		}
		f := s.queue[0]
		s.queue = s.queue[1:]
		s.mu.Unlock()

		f()

		s.mu.Lock()
		s.done++
		close(s.progress)
		s.progress = make(chan struct{})
		s.mu.Unlock()
	}
}

func (s *Stream) enqueue(f func()) error {
	return s.enqueueWith(func() func() { return f })
}

// enqueueWith adds the work prepare returns, calling prepare only if the stream accepts work, so that
// an event is counted as recorded only when its record is queued.
func (s *Stream) enqueueWith(prepare func() func()) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.destroyed {
		return errDestroyed
	}
	s.queue = append(s.queue, prepare())
	s.enqueued++
	select {
	case s.wake <- struct{}{}:
	default:
	}
	return nil
}

// CopyAsync implements gpu.Stream.
func (s *Stream) CopyAsync(dst, src gpu.Ptr, n int) error {
	d, err := s.dev.Bytes(dst, n)
	if err != nil {
		return fmt.Errorf("fake copy destination: %w", err)
	}
	b, err := s.dev.Bytes(src, n)
	if err != nil {
		return fmt.Errorf("fake copy source: %w", err)
	}
	return s.enqueue(func() { copy(d, b) })
}

// Record implements gpu.Stream.
func (s *Stream) Record(e gpu.Event) error {
	ev, ok := e.(*Event)
	if !ok {
		return fmt.Errorf("fake stream: record of a %T", e)
	}
	return s.enqueueWith(func() func() {
		gen := ev.recorded.Add(1)
		return func() { ev.complete(gen) }
	})
}

// WaitEvent implements gpu.Stream. As with cudaStreamWaitEvent, it waits for the Record made
// before it was called; an event never recorded is already complete.
func (s *Stream) WaitEvent(e gpu.Event) error {
	ev, ok := e.(*Event)
	if !ok {
		return fmt.Errorf("fake stream: wait on a %T", e)
	}
	gen := ev.recorded.Load()
	return s.enqueue(func() { _ = ev.wait(context.Background(), gen) })
}

// Synchronize implements gpu.Stream.
func (s *Stream) Synchronize(ctx context.Context) error {
	s.mu.Lock()
	target := s.enqueued
	for s.done < target {
		ch := s.progress
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			s.mu.Lock()
			done := s.done
			s.mu.Unlock()
			return fmt.Errorf("fake stream: %d of %d operations done: %w", done, target, ctx.Err())
		}
		s.mu.Lock()
	}
	s.mu.Unlock()
	return nil
}

// Destroy implements gpu.Stream: enqueued work still runs, as cudaStreamDestroy lets it.
func (s *Stream) Destroy() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.destroyed {
		return errDestroyed
	}
	s.destroyed = true
	select {
	case s.wake <- struct{}{}:
	default:
	}
	s.dev.mu.Lock()
	delete(s.dev.streams, s.Handle())
	s.dev.mu.Unlock()
	return nil
}

// Event is a fake CUDA event: a count of records made and completed.
type Event struct {
	recorded atomic.Uint64

	mu        sync.Mutex
	completed uint64
	progress  chan struct{}
}

func newEvent() *Event { return &Event{progress: make(chan struct{})} }

func (e *Event) complete(gen uint64) {
	e.mu.Lock()
	if gen > e.completed {
		e.completed = gen
	}
	close(e.progress)
	e.progress = make(chan struct{})
	e.mu.Unlock()
}

func (e *Event) wait(ctx context.Context, gen uint64) error {
	e.mu.Lock()
	for e.completed < gen {
		ch := e.progress
		e.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("fake event: record %d not complete: %w", gen, ctx.Err())
		}
		e.mu.Lock()
	}
	e.mu.Unlock()
	return nil
}

// Query implements gpu.Event.
func (e *Event) Query() (bool, error) {
	gen := e.recorded.Load()
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.completed >= gen, nil
}

// Synchronize implements gpu.Event.
func (e *Event) Synchronize(ctx context.Context) error { return e.wait(ctx, e.recorded.Load()) }

// Destroy implements gpu.Event.
func (e *Event) Destroy() error { return nil }
