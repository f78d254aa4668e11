// Package gpu is the device layer the engine drives for tensors in accelerator memory: streams,
// events, device memory and a collective communicator, behind small interfaces so that a real
// backend (package internal/gpu/nccl: the CUDA runtime and NCCL, both loaded at run time) and a fake one on
// host memory (package internal/gpu/fake, for tests without a GPU) stand side by side, as internal/transport/inmem
// stands beside internal/transport/tcp.
//
// Work on a Stream is asynchronous and ordered, as on a CUDA stream: a method that takes a Stream
// only enqueues, and its error reports a refused enqueue, never the outcome. Outcomes are seen
// through Event/Stream synchronisation and Comm.AsyncError. Every host-side wait takes a context,
// so that no wait is unbounded; a communicator whose peer is lost is ended with Comm.Abort.
//
// It must not know about tensors, names, negotiation or fusion (the engine's), nor decide policy
// beyond the pure fallback rule in Decide.
package gpu

import (
	"context"
	"errors"
)

// Ptr is an address in a device's memory. It is a number, not a Go pointer: the garbage collector
// must never see it, and only the backend that produced it may interpret it.
type Ptr uintptr

// Add is p offset by n bytes, for addressing inside a fusion buffer.
func (p Ptr) Add(n int) Ptr { return p + Ptr(n) }

// Device is one accelerator as seen by one process: its memory, its streams and events.
type Device interface {
	// Alloc returns n bytes of device memory (n may be 0). Memory is not zeroed.
	Alloc(n int) (Ptr, error)
	Free(p Ptr) error
	NewStream() (Stream, error)
	// WrapStream adopts a stream another library owns (torch's current stream, passed as a
	// handle by the binding). Destroy on it does nothing.
	WrapStream(handle uintptr) (Stream, error)
	NewEvent() (Event, error)
}

// Stream is an ordered queue of device work.
type Stream interface {
	// CopyAsync enqueues a copy of n bytes from src to dst, both in device memory.
	CopyAsync(dst, src Ptr, n int) error
	// Record enqueues e: e completes when all work enqueued before it has.
	Record(e Event) error
	// WaitEvent makes work enqueued after it wait for the latest Record of e, without blocking
	// the host.
	WaitEvent(e Event) error
	// Synchronize blocks until all enqueued work has completed, or ctx ends (then the work goes
	// on, as a GPU kernel does: only Comm.Abort ends a stuck collective).
	Synchronize(ctx context.Context) error
	Destroy() error
}

// Event marks a point in a stream.
type Event interface {
	// Query reports whether the work before the latest Record has completed, without blocking.
	Query() (bool, error)
	// Synchronize blocks until Query would report true, or ctx ends.
	Synchronize(ctx context.Context) error
	Destroy() error
}

// UniqueIDBytes is the size of a communicator id (NCCL_UNIQUE_ID_BYTES).
const UniqueIDBytes = 128

// UniqueID names a communicator being formed. One rank makes it; the others receive its bytes
// through kolo's authenticated rendezvous (it lets whoever holds it join the communicator).
type UniqueID [UniqueIDBytes]byte

// Library forms communicators among ranks, one device per rank.
type Library interface {
	// NewUniqueID makes the id the other ranks join with (called on one rank).
	NewUniqueID() (UniqueID, error)
	// NewComm joins communicator id as rank of size, on dev. It returns when every rank has
	// joined, or aborts the half-formed communicator and fails when ctx ends.
	NewComm(ctx context.Context, dev Device, id UniqueID, size, rank int) (Comm, error)
}

// Comm is one rank's end of a communicator. Collectives enqueue on the given stream; buffers are
// counted in elements of t. Calls on one Comm are not concurrent: the engine's loop owns it.
type Comm interface {
	Rank() int
	Size() int
	AllReduce(send, recv Ptr, count int, t DataType, op RedOp, s Stream) error
	// Broadcast copies root's send into every rank's recv (send is read on root only).
	Broadcast(send, recv Ptr, count int, t DataType, root int, s Stream) error
	// AllGather concatenates every rank's sendCount elements into recv, in rank order.
	AllGather(send, recv Ptr, sendCount int, t DataType, s Stream) error
	// ReduceScatter reduces Size()*recvCount elements and leaves block Rank() in recv.
	ReduceScatter(send, recv Ptr, recvCount int, t DataType, op RedOp, s Stream) error
	Send(buf Ptr, count int, t DataType, peer int, s Stream) error
	Recv(buf Ptr, count int, t DataType, peer int, s Stream) error
	// GroupStart and GroupEnd bracket operations that are launched together (AllToAll's
	// sends and receives): nothing inside a group starts before GroupEnd. The group is the
	// calling OS thread's, as NCCL's: call them through Group.
	GroupStart() error
	GroupEnd() error
	// AsyncError is nil while the communicator is healthy; an error once it failed or was aborted.
	AsyncError() error
	// Abort ends the communicator and whatever it has in flight, on this rank; peers blocked in a
	// collective with this rank stay blocked until they abort too. The Comm is unusable after.
	Abort() error
	// Destroy releases a healthy communicator after its work completed.
	Destroy() error
}

// Splitter is a Comm that can form sub-communicators without a new id exchange
// (ncclCommSplit, NCCL 2.18 and later). Ranks passing the same color form one; key orders them;
// NoColor leaves a rank out (it gets a nil Comm).
type Splitter interface {
	Split(ctx context.Context, color, key int) (Comm, error)
}

// NoColor is the Split color of a rank that joins no sub-communicator (NCCL_SPLIT_NOCOLOR).
const NoColor = -1

// ErrAborted is matched by the errors of a communicator, and of work on it, after Abort.
var ErrAborted = errors.New("communicator aborted")

// ErrUnavailable is matched by every error that means "the device path cannot serve here": the
// caller logs it and uses the staged host path.
var ErrUnavailable = errors.New("device collectives unavailable")
