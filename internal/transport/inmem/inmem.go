// Package inmem is an in-process transport: a group of ranks that are goroutines of one process,
// joined by bounded byte pipes, with shared slots in ordinary memory and an in-memory Messenger.
// It exists so that collective algorithms and the engine can be tested, under the race detector,
// without sockets or shared-memory segments, and so that failures (a rank dying) can be scripted.
//
// It keeps the letter of the transport contracts, not more: a pipe buffers exactly the configured
// number of bytes (transport.MinBuffered by default), so an algorithm that relies on more buffering
// than the contract promises deadlocks here rather than in production. It must not be used between
// processes, and it must not grow features the real transports lack.
package inmem

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kolo-dl/kolo/internal/transport"
)

// DefaultSlotBytes is the size of each rank's shared slot unless WithSlotBytes says otherwise.
const DefaultSlotBytes = 1 << 20

// Option configures New.
type Option func(*config)

type config struct {
	slotBytes      int
	shared         bool
	buffer         int
	oversubscribed bool
	progress       time.Duration
}

// WithSlotBytes sets the length of every rank's shared slot (Shared.Slot). Small slots make
// algorithms chunk, which tests want to exercise.
func WithSlotBytes(n int) Option { return func(c *config) { c.slotBytes = n } }

// WithoutShared turns the shared-memory capability off, so that algorithms take their
// message-passing paths: Slot then returns nil (collectives treat an empty slot as "not shared")
// and Barrier fails. Use Endpoint.Comm for a view that does not even satisfy transport.Shared.
func WithoutShared() Option { return func(c *config) { c.shared = false } }

// WithOversubscribed makes Shared.Oversubscribed report true, so that tests run the algorithms'
// choices for hosts with more ranks than CPUs whatever this machine has. By default it reports
// false.
func WithOversubscribed() Option { return func(c *config) { c.oversubscribed = true } }

// WithBuffer sets how many bytes each directed pipe buffers (default transport.MinBuffered).
// Values below transport.MinBuffered break the Comm contract; they are allowed so that tests can
// squeeze flow control, and only algorithms that never Send before Recv survive them.
func WithBuffer(n int) Option { return func(c *config) { c.buffer = n } }

// WithProgressTimeout makes a SendRecv (Send, Recv) that waited d on a peer that moved no byte, or a
// Barrier that waited d on ranks that did not arrive, fail with a *transport.StallError, as the
// real transports do (there by default, here only with this option). Time this rank spent paused
// does not count.
func WithProgressTimeout(d time.Duration) Option { return func(c *config) { c.progress = d } }

// New creates a group of size ranks and returns one Endpoint per rank, in rank order.
func New(size int, opts ...Option) []*Endpoint {
	if size < 1 {
		panic(fmt.Sprintf("inmem.New: size %d < 1", size))
	}
	cfg := config{slotBytes: DefaultSlotBytes, shared: true, buffer: transport.MinBuffered}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.buffer < 1 {
		cfg.buffer = 1
	}
	g := &group{
		size:           size,
		shared:         cfg.shared,
		oversubscribed: cfg.oversubscribed,
		progress:       max(cfg.progress, 0),
		eps:            make([]*Endpoint, size),
		pipes:          make([][]*pipe, size),
		gone:           make(chan struct{}),
	}
	g.bar.waiting = make([]int, 0, size)
	if cfg.shared {
		// One allocation for all slots, as a real segment would be one mapping.
		all := make([]byte, size*cfg.slotBytes)
		g.slots = make([][]byte, size)
		for r := range g.slots {
			g.slots[r] = all[r*cfg.slotBytes : (r+1)*cfg.slotBytes : (r+1)*cfg.slotBytes]
		}
	}
	for r := range g.eps {
		g.eps[r] = &Endpoint{
			g:       g,
			rank:    r,
			dead:    make(chan struct{}),
			closed:  make(chan struct{}),
			barWake: make(chan struct{}, 1),
			mail:    mailbox{notify: make(chan struct{}, 1)},
			inbox:   make(chan transport.Msg),
		}
	}
	for from := range g.pipes {
		g.pipes[from] = make([]*pipe, size)
		for to := range g.pipes[from] {
			g.pipes[from][to] = &pipe{
				buf:        make([]byte, cfg.buffer),
				dataReady:  make(chan struct{}, 1),
				spaceReady: make(chan struct{}, 1),
			}
		}
	}
	return g.eps
}

type group struct {
	size           int
	shared         bool
	oversubscribed bool
	progress       time.Duration // 0: no progress deadline
	eps            []*Endpoint
	pipes          [][]*pipe // pipes[from][to]
	slots          [][]byte
	bar            barrier

	// gone is closed when the first endpoint is killed or closed, so that barrier waiters (who
	// wait on everyone, not on one peer) wake up and look at who left.
	goneOnce sync.Once
	gone     chan struct{}
}

func (g *group) markGone() { g.goneOnce.Do(func() { close(g.gone) }) }

// Endpoint is one rank of an inmem group. It implements transport.Comm, transport.Shared and
// transport.Messenger. Like every Comm, its Comm methods are for one goroutine at a time (SendRecv
// counts as one); SendMsg, Kill and Close may be called from anywhere.
type Endpoint struct {
	g    *group
	rank int
	memo atomic.Uint32 // transport.Shared's Memo

	killOnce sync.Once
	killErr  error         // set before dead is closed
	dead     chan struct{} // closed by Kill

	closeOnce sync.Once
	closed    chan struct{} // closed by Close

	barWake chan struct{} // the last rank into a barrier wakes the others through these

	mail      mailbox
	inbox     chan transport.Msg
	pumpMu    sync.Mutex
	pumping   bool
	inboxShut bool

	pauseMu  sync.Mutex
	paused   chan struct{} // while paused: closed by Resume (under pauseMu)
	isPaused atomic.Bool   // paused != nil, for the hot path
	pauses   atomic.Int32  // Pauses so far: a wait that spans one restarts its clock

	timer *time.Timer // the progress deadline's, made at the first wait that needs it and reused
}

var (
	_ transport.Comm      = (*Endpoint)(nil)
	_ transport.Shared    = (*Endpoint)(nil)
	_ transport.Messenger = (*Endpoint)(nil)
)

// Rank is the endpoint's rank in its group.
func (e *Endpoint) Rank() int { return e.rank }

// Size is the number of ranks in the group.
func (e *Endpoint) Size() int { return e.g.size }

// Kill simulates this rank dying: its own pending and future calls fail, every peer's pending or
// future call that involves it fails at once with a *transport.PeerError naming it (bytes it sent
// but that were not yet received are lost, as with a crashed process), a Barrier of the group fails,
// and every live peer's Messenger delivers Msg{From: rank, Body: nil}. err is the cause peers see
// (nil means "killed").
func (e *Endpoint) Kill(err error) {
	e.killOnce.Do(func() {
		if err == nil {
			err = errors.New("killed")
		}
		e.killErr = err
		close(e.dead)
		for _, p := range e.g.eps {
			if p != e {
				p.mail.put(transport.Msg{From: e.rank})
			}
		}
		e.g.markGone()
	})
}

// Pause simulates this rank's process being stopped (SIGSTOP): from its next step on, its calls
// move no byte and do not return until Resume (or Kill, or Close), while its peers see it alive. A
// wait that spans a pause does not blame its peers for the paused time, as a stopped process does
// not. Pausing a paused endpoint does nothing.
func (e *Endpoint) Pause() {
	e.pauseMu.Lock()
	defer e.pauseMu.Unlock()
	if e.paused == nil {
		e.paused = make(chan struct{})
		e.pauses.Add(1)
		e.isPaused.Store(true)
	}
}

// Resume lets a paused endpoint go on (SIGCONT).
func (e *Endpoint) Resume() {
	e.pauseMu.Lock()
	defer e.pauseMu.Unlock()
	if e.paused != nil {
		close(e.paused)
		e.paused = nil
		e.isPaused.Store(false)
	}
}

// stayPaused blocks while the endpoint is paused. It returns the number of pauses so far.
func (e *Endpoint) stayPaused() int32 {
	if e.isPaused.Load() {
		e.pauseMu.Lock()
		p := e.paused
		e.pauseMu.Unlock()
		if p != nil {
			select {
			case <-p:
			case <-e.dead:
			case <-e.closed:
			}
		}
	}
	return e.pauses.Load()
}

// stallClock is a call's progress deadline: zero until the call first waits, restarted by every
// move and by a pause of this endpoint.
type stallClock struct {
	since  time.Time
	pauses int32
}

// expired reports whether the call waited the whole progress timeout since it last moved, and
// otherwise arms e.timer for what is left; timerC is its channel, nil without a timeout.
func (e *Endpoint) expired(c *stallClock, pauses int32) (expired bool, timerC <-chan time.Time) {
	limit := e.g.progress
	if limit <= 0 {
		return false, nil
	}
	now := time.Now()
	if c.since.IsZero() || pauses != c.pauses {
		c.since, c.pauses = now, pauses
	}
	left := limit - now.Sub(c.since)
	if left <= 0 {
		return true, nil
	}
	if e.timer == nil {
		e.timer = time.NewTimer(left)
	} else {
		e.timer.Reset(left)
	}
	return false, e.timer.C
}

func (e *Endpoint) stall(peer int, op, detail string) error {
	return &transport.StallError{Rank: peer, Op: op, For: e.g.progress, Detail: detail}
}

func (e *Endpoint) isKilled() bool {
	select {
	case <-e.dead:
		return true
	default:
		return false
	}
}

func (e *Endpoint) isClosed() bool {
	select {
	case <-e.closed:
		return true
	default:
		return false
	}
}

// Close ends this endpoint gracefully: its pending calls fail with transport.ErrClosed and its
// Inbox is closed. Peers may still receive the bytes it sent before closing; after that, a Recv
// from it, a Send to it or a Barrier waiting for it fails with a *transport.PeerError wrapping
// transport.ErrClosed. Close is not a loss: peers' Messengers are not notified.
func (e *Endpoint) Close() error {
	e.closeOnce.Do(func() {
		close(e.closed)
		e.g.markGone()
		e.pumpMu.Lock()
		e.inboxShut = true
		if !e.pumping {
			close(e.inbox)
		}
		e.pumpMu.Unlock()
	})
	return nil
}

// Comm returns the endpoint as a transport.Comm that satisfies transport.Shared only when the group
// was built with shared slots: the view to hand to code that detects Shared by type assertion.
func (e *Endpoint) Comm() transport.Comm {
	if e.g.shared {
		return e
	}
	return plain{e}
}

// plain hides Slot and Barrier.
type plain struct{ e *Endpoint }

func (p plain) Rank() int { return p.e.Rank() }
func (p plain) Size() int { return p.e.Size() }
func (p plain) Send(ctx context.Context, peer int, b []byte) error {
	return p.e.Send(ctx, peer, b)
}
func (p plain) Recv(ctx context.Context, peer int, b []byte) error {
	return p.e.Recv(ctx, peer, b)
}
func (p plain) SendRecv(ctx context.Context, to int, sb []byte, from int, rb []byte) error {
	return p.e.SendRecv(ctx, to, sb, from, rb)
}
func (p plain) Close() error { return p.e.Close() }

// selfErr says why this endpoint itself can no longer communicate, or nil.
func (e *Endpoint) selfErr(op string) error {
	if e.isKilled() {
		return fmt.Errorf("inmem: rank %d: %s: this rank was killed: %w", e.rank, op, e.killErr)
	}
	if e.isClosed() {
		return fmt.Errorf("inmem: rank %d: %s: %w", e.rank, op, transport.ErrClosed)
	}
	return nil
}

func (e *Endpoint) peerKilledErr(peer int, op string) error {
	p := e.g.eps[peer]
	return &transport.PeerError{Rank: peer, Op: op, Err: p.killErr}
}

func (e *Endpoint) checkPeer(peer int, op string) error {
	if peer < 0 || peer >= e.g.size {
		return fmt.Errorf("inmem: rank %d: %s rank %d: out of range [0,%d)", e.rank, op, peer, e.g.size)
	}
	return nil
}

func ctxErr(e *Endpoint, ctx context.Context, op string, peer int) error {
	return fmt.Errorf("inmem: rank %d: %s rank %d: %w", e.rank, op, peer, ctx.Err())
}

// Send writes all of b into the pipe to peer, waiting for room when the peer is behind.
func (e *Endpoint) Send(ctx context.Context, peer int, b []byte) error {
	return e.SendRecv(ctx, peer, b, peer, nil)
}

// Recv reads len(b) bytes from the pipe from peer.
func (e *Endpoint) Recv(ctx context.Context, peer int, b []byte) error {
	return e.SendRecv(ctx, peer, nil, peer, b)
}

// SendRecv moves sb to `to` and rb from `from` in one loop that makes progress on whichever side
// can move, so it needs no helper goroutine (and so allocates nothing).
func (e *Endpoint) SendRecv(ctx context.Context, to int, sb []byte, from int, rb []byte) error {
	if err := e.checkPeer(to, "send to"); err != nil {
		return err
	}
	if err := e.checkPeer(from, "recv from"); err != nil {
		return err
	}
	if len(sb) == 0 && len(rb) == 0 {
		return nil
	}
	out := e.g.pipes[e.rank][to]
	in := e.g.pipes[from][e.rank]
	toEp, fromEp := e.g.eps[to], e.g.eps[from]
	sending, receiving := len(sb) > 0, len(rb) > 0
	nsb, nrb := len(sb), len(rb)
	var clock stallClock
	for {
		pauses := e.stayPaused()
		if err := e.selfErr("sendrecv"); err != nil {
			return err
		}
		// A killed peer fails every pending call that involves it, even one whose bytes for it
		// were already buffered: the peer will never act on them.
		if sending && toEp.isKilled() {
			return e.peerKilledErr(to, "send")
		}
		if receiving && fromEp.isKilled() {
			return e.peerKilledErr(from, "recv")
		}
		progress := false
		if len(sb) > 0 {
			if toEp.isClosed() {
				return &transport.PeerError{Rank: to, Op: "send", Err: transport.ErrClosed}
			}
			n := out.write(sb)
			sb = sb[n:]
			progress = n > 0
		}
		if len(rb) > 0 {
			n := in.read(rb)
			rb = rb[n:]
			if n > 0 {
				progress = true
			} else if fromEp.isClosed() && in.buffered() == 0 {
				return &transport.PeerError{Rank: from, Op: "recv", Err: transport.ErrClosed}
			}
		}
		if len(sb) == 0 && len(rb) == 0 {
			return nil
		}
		if progress {
			clock.since = time.Time{}
			continue
		}
		expired, timeout := e.expired(&clock, pauses)
		if expired {
			// Blame the peer whose data does not arrive first, as the real transports do.
			if len(rb) > 0 {
				return e.stall(from, "recv", fmt.Sprintf("%d of %d bytes received", nrb-len(rb), nrb))
			}
			return e.stall(to, "send", fmt.Sprintf("%d of %d bytes sent", nsb-len(sb), nsb))
		}
		var space, data, toClosed, fromClosed chan struct{}
		if len(sb) > 0 {
			space = out.spaceReady
			toClosed = toEp.closed
		}
		if len(rb) > 0 {
			data = in.dataReady
			fromClosed = fromEp.closed
		}
		var toDead, fromDead chan struct{}
		if sending {
			toDead = toEp.dead
		}
		if receiving {
			fromDead = fromEp.dead
		}
		select {
		case <-space:
		case <-data:
		case <-toDead:
		case <-fromDead:
		case <-toClosed:
		case <-fromClosed:
		case <-e.dead:
		case <-e.closed:
		case <-timeout:
		case <-ctx.Done():
			if len(sb) > 0 {
				return ctxErr(e, ctx, "send to", to)
			}
			return ctxErr(e, ctx, "recv from", from)
		}
		if timeout != nil {
			e.timer.Stop()
		}
	}
}

// pipe is a bounded byte ring from one rank to another. Exactly one goroutine writes and one reads
// at a time (Comm is single-goroutine per endpoint), so one-slot signal channels suffice: a stale
// signal only costs a spurious loop.
type pipe struct {
	mu   sync.Mutex
	buf  []byte
	head int // read position
	n    int // bytes buffered

	dataReady  chan struct{}
	spaceReady chan struct{}
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

func (p *pipe) write(b []byte) int {
	p.mu.Lock()
	total := 0
	for len(b) > 0 && p.n < len(p.buf) {
		tail := (p.head + p.n) % len(p.buf)
		end := len(p.buf)
		if tail < p.head {
			end = p.head
		}
		k := copy(p.buf[tail:end], b)
		b = b[k:]
		p.n += k
		total += k
	}
	p.mu.Unlock()
	if total > 0 {
		signal(p.dataReady)
	}
	return total
}

func (p *pipe) read(b []byte) int {
	p.mu.Lock()
	total := 0
	for len(b) > 0 && p.n > 0 {
		end := p.head + p.n
		if end > len(p.buf) {
			end = len(p.buf)
		}
		k := copy(b, p.buf[p.head:end])
		b = b[k:]
		p.head = (p.head + k) % len(p.buf)
		p.n -= k
		total += k
	}
	if p.n == 0 {
		p.head = 0
	}
	p.mu.Unlock()
	if total > 0 {
		signal(p.spaceReady)
	}
	return total
}

func (p *pipe) buffered() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}
