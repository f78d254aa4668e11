// Package transport defines how ranks move bytes: the Comm interface that every collective algorithm
// is written against, the Messenger interface the engine negotiates over, and the errors both report.
//
// Implementations live in sub-packages: tcp (between hosts), shm (ranks of one host), inmem (tests),
// and the routing Comm in this package that picks one per peer. This package must not know about
// tensors, ops or the engine: it moves bytes between numbered ranks and says who failed.
package transport

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
)

// Comm is a reliable, ordered, point-to-point byte stream between every pair of ranks of a group.
//
// Stream semantics: the bytes of successive Sends from a to b arrive, in order, at successive Recvs
// of b from a; message boundaries are not kept, so both sides must agree on lengths (collectives
// always do). A Comm is used by one goroutine at a time (the engine executes one op at a time);
// implementations need not be safe for concurrent calls except where a method says so.
//
// Every call ends when ctx is done; the error then wraps ctx.Err(). When a peer is lost (its
// process died, its connection broke) every call involving it fails with a *PeerError.
type Comm interface {
	// Rank is this process's index in the group, in [0, Size()).
	Rank() int
	// Size is the number of ranks in the group.
	Size() int
	// Send transmits all of b to peer. It returns once b may be reused; it may return before the
	// peer has received the data (buffered), but must not require the peer to be receiving for
	// sends of up to MinBuffered bytes.
	Send(ctx context.Context, peer int, b []byte) error
	// Recv fills all of b with the next len(b) bytes from peer.
	Recv(ctx context.Context, peer int, b []byte) error
	// SendRecv sends sb to `to` while receiving len(rb) bytes from `from`, concurrently, so that
	// rings and pairwise exchanges of any size never deadlock. to and from may be equal. Either
	// buffer may be empty. sb and rb must not overlap.
	SendRecv(ctx context.Context, to int, sb []byte, from int, rb []byte) error
	// Close releases the Comm's resources. Pending calls fail.
	Close() error
}

// MinBuffered is the number of bytes every Comm accepts in a Send without the peer receiving.
// Algorithms that send a small message before receiving (barrier, tree fan-out headers) rely on it.
const MinBuffered = 64 << 10

// Msg is one framed control message received from a peer.
type Msg struct {
	From int
	Body []byte
}

// Messenger carries the engine's small framed control messages (negotiation requests, responses,
// abort notices) between ranks. Unlike Comm it keeps message boundaries and delivers messages from
// all peers through one channel, so the engine can wait on "anything from anyone".
//
// SendMsg is safe for concurrent use. Messages from one sender arrive in the order sent.
type Messenger interface {
	// SendMsg sends body to peer as one message. It may buffer; body may be reused on return.
	SendMsg(ctx context.Context, peer int, body []byte) error
	// Inbox delivers messages from every peer. When a peer is lost, the Messenger delivers one
	// Msg{From: peer, Body: nil} and Lost reports the cause. The channel is closed by Close.
	Inbox() <-chan Msg
	// Lost returns the error that ended communication with peer, or nil if it is healthy.
	Lost(peer int) error
	Close() error
}

// Poller is an optional capability of a Messenger: its owner takes messages directly instead of
// through Inbox, so a message costs no goroutine hand-off. The engine polls with TryRecv while it
// spins and sleeps in Sleep when idle; with shared memory a message then wakes the sleeper itself
// (one futex wake) rather than a reader goroutine that wakes the engine through a channel.
//
// A Messenger is read either through Inbox or through TryRecv, never both: a Poller delivers each
// message once, to whichever its owner chose. Find the capability with PollerOf, which also looks
// through a Route.
type Poller interface {
	// TryRecv returns the next message from any peer if one has arrived, without blocking. A lost
	// peer is reported as Inbox reports it: one Msg{From: peer, Body: nil}, after every message it
	// sent, with Lost saying why. err matches ErrClosed once the Messenger is closed. Calls must not
	// overlap each other or Sleep.
	TryRecv() (m Msg, ok bool, err error)
	// Sleep blocks until a message may have arrived, ready() holds, Wake is called or d passes,
	// whichever is first; it may also return for no reason. ready is evaluated after Sleep has
	// registered as a sleeper, so a Wake that follows a change ready() sees is never lost.
	Sleep(ready func() bool, d time.Duration)
	// Wake makes a Sleep in progress return. Safe for concurrent use, from any goroutine, also
	// after Close; it costs no system call when nobody sleeps.
	Wake()
}

// PollerOf returns m's Poller capability. A Route that hands a single Messenger through (every peer
// on one host) has the capability of that Messenger; one that merges several has none.
func PollerOf(m Messenger) (Poller, bool) {
	if r, ok := m.(*Route); ok {
		if r.direct == nil {
			return nil, false
		}
		m = r.direct
	}
	p, ok := m.(Poller)
	return p, ok
}

// ErrClosed is returned by calls on a Comm or Messenger after Close.
var ErrClosed = errors.New("transport closed")

// ErrAborted is matched by the errors of transfers that a Group-wide abort ended (another rank of
// the group stopped its engine, and told every rank why itself): the engine stops without telling
// the peers again.
var ErrAborted = errors.New("shm group aborted")

// ErrPeerLost is the sentinel every *PeerError matches with errors.Is.
var ErrPeerLost = errors.New("peer lost")

// PeerError says which peer failed and why. Errors from Comm and Messenger methods that are caused
// by a peer (connection reset, EOF, a dead process) are *PeerError so that the engine can name the
// lost rank in the error every other rank reports.
type PeerError struct {
	Rank int    // the peer's rank in the group that reported it
	Host string // the peer's host, when known
	Op   string // what was being done: "send", "recv", "connect", ...
	Err  error
}

func (e *PeerError) Error() string {
	host := ""
	if e.Host != "" {
		host = " on " + e.Host
	}
	return fmt.Sprintf("rank %d%s lost during %s: %v", e.Rank, host, e.Op, e.Err)
}

func (e *PeerError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrPeerLost) true for every *PeerError.
func (e *PeerError) Is(target error) bool { return target == ErrPeerLost }

// DefaultProgressTimeout is how long a transfer waits on a peer that moves no byte, and a Barrier on
// ranks that do not arrive, before it fails with a *StallError (tcp.Config, shm.Config and the
// engine's Config take it when theirs is 0). Progress, not total time: a transfer of any size over
// any link that moves at all never meets it, since every byte resets the clock. A peer inside the
// same collective stops moving only when its process does not run (stopped, hung, swapping for a
// minute) or its link is cut; the pauses a healthy job sees (scheduling, GC, a VM migrated, TCP
// retransmitting through a short outage) last milliseconds to seconds. 60 s clears them by far,
// and is Horovod's stall warning.
const DefaultProgressTimeout = 60 * time.Second

// Dead-host bounds: DeadHostTimeout's default and least value.
const (
	DefaultDeadHostTimeout = 10 * time.Second
	MinDeadHostTimeout     = 2 * time.Second
)

// DeadHostTimeout is how long a connection may go unacknowledged (its sent data, or the keepalive
// probes of an idle one) before its peer's host counts as gone: it vanished, or its link was cut.
// A peer process that is stopped or busy is not affected, since its kernel still answers (the
// progress deadline handles those). It follows a progress timeout shorter than
// DefaultDeadHostTimeout, since a user who tolerates only that long without progress wants a
// vanished host noticed as soon, but never below MinDeadHostTimeout, which retransmissions on a
// congested link can take.
func DeadHostTimeout(progress time.Duration) time.Duration {
	if progress > 0 && progress < DefaultDeadHostTimeout {
		return max(progress, MinDeadHostTimeout)
	}
	return DefaultDeadHostTimeout
}

// ErrStalled is the sentinel every *StallError matches with errors.Is.
var ErrStalled = errors.New("peer made no progress")

// StallError says that a transfer or Barrier waited the whole progress timeout on a peer whose
// process and connection look alive but that moved nothing: it is stopped (SIGSTOP, a debugger),
// hung, or cut off. The transfer is abandoned midway, so the Comm's stream to and from that peer is
// out of step: the group cannot go on with it.
type StallError struct {
	Rank   int           // the awaited peer's rank in the group that reported it
	Host   string        // its host, when known
	Op     string        // what this rank waited on it for: "recv", "send", "barrier"
	For    time.Duration // the progress timeout that ran out
	Detail string        // how far the call got ("1024 of 4096 bytes received"); may be empty
}

func (e *StallError) Error() string {
	host := ""
	if e.Host != "" {
		host = " (" + e.Host + ")"
	}
	what := e.Op
	if e.Detail != "" {
		what += ": " + e.Detail
	}
	return fmt.Sprintf("rank %d%s made no progress for %v (%s)", e.Rank, host, e.For, what)
}

// NotRunning reports whether a watchdog's look that came gap after the previous one, due every
// period, shows that this process did not run meanwhile (stopped, its host suspended) rather
// than that it ran late: then the peers are not to blame for that time, and progress clocks
// start again. Every progress watchdog uses this one rule.
func NotRunning(gap, period time.Duration) bool {
	return gap > max(4*period, 500*time.Millisecond)
}

// Is makes errors.Is(err, ErrStalled) true for every *StallError.
func (e *StallError) Is(target error) bool { return target == ErrStalled }

// Shared is an optional capability of a Comm whose ranks all share one memory segment (the shm
// transport, or inmem in tests). Collectives check for it with a type assertion and then reduce
// directly in the peers' slots instead of streaming bytes through Send/Recv.
type Shared interface {
	// Slot returns rank r's data slot, mapped in this process. Every slot has the same length,
	// fixed for the life of the Comm (allocated once, never re-faulted per op); callers chunk
	// larger buffers. A rank may write only its own slot; it may read any slot after a Barrier
	// that followed the owner's writes.
	Slot(r int) []byte
	// Barrier returns once every rank of the group has entered the same Barrier (the n-th call on
	// each rank matches the n-th call on the others). It orders memory: writes before Barrier on
	// any rank are visible to reads after it on every rank. It fails with a *PeerError when a rank
	// is lost and with ctx's error when ctx ends.
	Barrier(ctx context.Context) error
	// Oversubscribed reports whether the group has more ranks than the host has CPUs for them,
	// with the same answer on every rank: waits then sleep instead of spinning, so algorithms
	// should prefer fewer, larger steps.
	Oversubscribed() bool
	// Memo is a word this rank keeps for the group's algorithms for as long as the group lives
	// (the collectives keep there the slot-store mode their first shared collective measured):
	// what they learn of a group goes with the group, and a new group starts at zero. A view of
	// the whole group (Sub) shares the group's word.
	Memo() *atomic.Uint32
}

// Spinner is an optional capability of a Comm whose waits poll before they sleep: SetSpin changes
// how long, from the next wait on, in every wait of the transport on this rank (the autotuner's
// spin time; a rank's own business, which its peers need not share). d <= 0: never poll.
type Spinner interface {
	SetSpin(d time.Duration)
}
