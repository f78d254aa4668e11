package engine

import (
	"context"
	"fmt"
	"sync"
)

// Handle is the future of one submitted op: Wait, Poll, Err. Safe for concurrent use.
type Handle struct {
	done       chan struct{}
	once       sync.Once
	err        error
	output     []byte        // allgather/alltoall: the engine-allocated result
	recvSplits []int64       // alltoall: rows received from each rank
	rows       int64         // allgather, alltoall, reducescatter: dim 0 of output
	joinLast   int           // join: the last rank to join
	setID      int           // AddProcessSet: the new set's id
	dev        *deviceResult // a device op's completion and result (device.go)
	name       string
	e          *Engine // whose loop Wait drives
	// reserved: the op holds its name in its process set (set) until it completes, so that the
	// same name submitted again meanwhile is refused (Engine.reserve).
	reserved bool
	set      int
	// refusal: the op was refused on this rank, and takes its turn only so that the other ranks
	// hear of it; a new op of its name takes the name over (Engine.reserve).
	refusal bool
}

func newHandle(name string, e *Engine) *Handle {
	return &Handle{done: make(chan struct{}), name: name, e: e}
}

func (h *Handle) finish(err error) {
	h.once.Do(func() {
		h.err = err
		if h.reserved {
			// Before done closes: a caller that saw the op complete may submit the name again.
			h.e.unreserve(h.set, h.name, h)
		}
		close(h.done)
	})
}

// Name is the op's name as negotiated.
func (h *Handle) Name() string { return h.name }

// Done is closed when the op has completed (successfully or not).
func (h *Handle) Done() <-chan struct{} { return h.done }

// Poll reports whether the op has completed.
func (h *Handle) Poll() bool {
	select {
	case <-h.done:
		return true
	default:
		return false
	}
}

// Wait blocks until the op completes or ctx ends, and returns the op's error. While it waits it
// runs the engine's loop itself, unless another goroutine already does (see drive.go): the op's
// result then needs no wake-up of another goroutine to reach the caller. If ctx ends while this
// caller is executing a collective, Wait returns once that collective is done, since abandoning it
// half-way would leave the peers mid-protocol.
func (h *Handle) Wait(ctx context.Context) error {
	if !h.Poll() && h.e != nil {
		h.e.await(ctx, h)
	}
	if h.Poll() {
		return h.err
	}
	select {
	case <-h.done:
		return h.err
	case <-ctx.Done():
		return fmt.Errorf("waiting for %q: %w", h.name, ctx.Err())
	}
}

// Err returns the op's error once it completed (nil before).
func (h *Handle) Err() error {
	if !h.Poll() {
		return nil
	}
	return h.err
}

// Output is the result buffer of ops whose output size is known only after negotiation
// (allgather, alltoall). Valid after a successful Wait.
func (h *Handle) Output() []byte { return h.output }

// Rows is dim 0 of the result of an allgather, alltoall or reducescatter (Output holds Rows rows):
// what the output's byte count cannot tell when a row holds no elements.
func (h *Handle) Rows() int64 { return h.rows }

// RecvSplits is, for alltoall, the number of dim-0 rows received from each rank.
func (h *Handle) RecvSplits() []int64 { return h.recvSplits }

// JoinLast is, for join, the rank that joined last.
func (h *Handle) JoinLast() int { return h.joinLast }

// ProcessSetID is, for a successful AddProcessSetAsync, the new process set's id.
func (h *Handle) ProcessSetID() int { return h.setID }
