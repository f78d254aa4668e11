//go:build linux

package shm

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kolo-dl/kolo/internal/transport"
)

const inboxLen = 1024

// readerSpin caps the reader goroutine's spin: it spins beside the engine's loop, which spins too,
// so it keeps to the few microseconds in which a reply usually arrives.
const readerSpin = 5 * time.Microsecond

// pollsPerClock is how many empty TryRecv calls go between readings of the clock for the peers'
// process check.
const pollsPerClock = 64

// messenger is the Group's transport.Messenger: framed messages on their own rings (so control
// traffic never queues behind a collective's data), every sender ringing the receiver's message
// doorbell after it publishes. It is read one of two ways, chosen by the first call: Inbox starts a
// reader goroutine that sleeps on the doorbell and forwards into a channel; TryRecv and Sleep
// (transport.Poller) let the owner drain the rings and sleep on the doorbell itself, which saves
// the reader's wake-up and the channel hand-off on every message.
type messenger struct {
	g     *Group
	inbox chan transport.Msg

	// sending side: one SendMsg at a time per peer, since each ring has one producer
	sendLock []chan struct{}
	send     []ringEnd
	broken   []error // a stream left mid-frame by a cancelled SendMsg; guarded by sendLock[p]

	// reading side, owned by the reader goroutine (Inbox) or, when polled, guarded by readMu
	readMu  sync.Mutex
	recv    []ringEnd
	dec     []frameDecoder
	polled  []transport.Msg // decoded, not yet returned by TryRecv
	checked time.Time       // when TryRecv last checked that its peers' processes are alive
	empties int             // TryRecv calls that found nothing since the clock was last read

	mode    atomic.Int32 // readUnchosen, readInbox or readPolled
	modeMu  sync.Mutex   // orders starting the reader against Close
	started bool         // the reader goroutine runs; guarded by modeMu

	lostMu sync.Mutex
	lost   []error

	selfMu sync.Mutex
	selfQ  [][]byte
	selfN  atomic.Int32

	stopping atomic.Bool   // read by the reader's wake-up condition
	stop     chan struct{} // closed with stopping set, for the reader blocked on a full inbox
	stopped  chan struct{} // closed by the reader as it exits
}

// How a messenger is read; the first of Inbox and TryRecv to be called decides, for good.
const (
	readUnchosen = iota
	readInbox
	readPolled
)

var (
	_ transport.Messenger = (*messenger)(nil)
	_ transport.Poller    = (*messenger)(nil)
)

func newMessenger(g *Group) *messenger {
	m := &messenger{g: g, inbox: make(chan transport.Msg, inboxLen),
		sendLock: make([]chan struct{}, g.size), send: make([]ringEnd, g.size), broken: make([]error, g.size),
		recv: make([]ringEnd, g.size), dec: make([]frameDecoder, g.size), lost: make([]error, g.size),
		stop: make(chan struct{}), stopped: make(chan struct{})}
	l, me := g.lay, g.rank
	for p := range g.size {
		m.sendLock[p] = make(chan struct{}, 1)
		if p == me {
			continue
		}
		m.send[p] = newRingEnd(g.mem, l.msgCtl(me, p), l.msgRing(me, p), l.msgRingBytes, true, g.bell(p, rMsgBell))
		m.recv[p] = newRingEnd(g.mem, l.msgCtl(p, me), l.msgRing(p, me), l.msgRingBytes, false, g.bell(p, rMsgSpaceBell))
	}
	return m
}

// Inbox delivers every message through a channel fed by a reader goroutine, started by the first
// call. If the messenger is already read through TryRecv, the channel stays empty until Close.
func (m *messenger) Inbox() <-chan transport.Msg {
	m.modeMu.Lock()
	defer m.modeMu.Unlock()
	if !m.stopping.Load() && m.mode.CompareAndSwap(readUnchosen, readInbox) {
		m.started = true
		go m.read()
	}
	return m.inbox
}

// Lost returns the error that ended messages from peer, or nil while it is healthy.
func (m *messenger) Lost(peer int) error {
	if peer < 0 || peer >= m.g.size {
		return fmt.Errorf("shm: rank %d: peer %d out of range [0, %d)", m.g.rank, peer, m.g.size)
	}
	m.lostMu.Lock()
	defer m.lostMu.Unlock()
	return m.lost[peer]
}

// SendMsg writes body as one frame to peer's ring. A frame that fits the ring is published at
// once; a longer one is streamed, and if ctx ends midway the stream to peer is left mid-frame and
// every later SendMsg to peer fails.
func (m *messenger) SendMsg(ctx context.Context, peer int, body []byte) error {
	g, me := m.g, m.g.rank
	if peer < 0 || peer >= g.size {
		return fmt.Errorf("shm: rank %d: send message to peer %d out of range [0, %d)", me, peer, g.size)
	}
	if len(body) > maxMsgBytes {
		return fmt.Errorf("shm: rank %d: send message of %d bytes to rank %d: over the %d-byte limit", me, len(body), peer, maxMsgBytes)
	}
	if peer == me {
		return m.sendSelf(body)
	}
	if err := m.Lost(peer); err != nil {
		return fmt.Errorf("shm: rank %d: send message to rank %d: %w", me, peer, err)
	}
	select {
	case m.sendLock[peer] <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("shm: rank %d: send message to rank %d: waiting for another sender: %w", me, peer, context.Cause(ctx))
	}
	defer func() { <-m.sendLock[peer] }()
	g.mu.RLock()
	defer g.mu.RUnlock()
	if g.msgClosed.Load() {
		return fmt.Errorf("shm: rank %d: send message to rank %d: %w", me, peer, transport.ErrClosed)
	}
	if err := m.broken[peer]; err != nil {
		return fmt.Errorf("shm: rank %d: send message to rank %d: %w", me, peer, err)
	}
	r := &m.send[peer]
	if err := g.reserveRing(r, "message", peer); err != nil {
		// Nothing was written: the stream is intact, and a later SendMsg tries again.
		return fmt.Errorf("shm: rank %d: send message of %d bytes to rank %d: %w", me, len(body), peer, err)
	}
	w := g.newWaiter(ctx, g.bell(me, rMsgSpaceBell), &g.msgClosed, false)
	defer w.done()
	gone := func(procs bool) error { return g.peerGone(peer, "send", stateMsgClosed, procs) }
	var hdr [frameHeaderBytes]byte
	putFrameHeader(hdr[:], len(body))
	frame := uint64(frameHeaderBytes + len(body))

	if frame <= r.size {
		fits := func() bool { return r.free() >= frame }
		for !fits() {
			m.relieve()
			if err := w.wait(fits, gone); err != nil {
				return fmt.Errorf("shm: rank %d: send message of %d bytes to rank %d: %w", me, len(body), peer, err)
			}
		}
		r.copyIn(hdr[:])
		r.copyIn(body)
		r.publish()
		return nil
	}
	// Longer than the ring: stream the header and body through it.
	sent := 0
	for _, part := range [][]byte{hdr[:], body} {
		for off := 0; off < len(part); {
			if n := r.put(part[off:]); n > 0 {
				off += n
				sent += n
				w.progressed()
				continue
			}
			m.relieve()
			if err := w.wait(r.writable, gone); err != nil {
				err = fmt.Errorf("shm: rank %d: send message of %d bytes to rank %d, %d of %d frame bytes sent: %w",
					me, len(body), peer, sent, frame, err)
				m.broken[peer] = fmt.Errorf("stream left mid-frame by an earlier failure: %w", err)
				return err
			}
		}
	}
	return nil
}

func (m *messenger) sendSelf(body []byte) error {
	if m.g.msgClosed.Load() {
		return fmt.Errorf("shm: rank %d: send message to itself: %w", m.g.rank, transport.ErrClosed)
	}
	m.selfMu.Lock()
	m.selfQ = append(m.selfQ, append([]byte{}, body...))
	m.selfN.Add(1)
	m.selfMu.Unlock()
	m.g.mu.RLock()
	if !m.g.released {
		m.g.bell(m.g.rank, rMsgBell).ring()
	}
	m.g.mu.RUnlock()
	return nil
}

// read is the reader goroutine: it drains every ring into the inbox and, when nothing arrives,
// sleeps on this rank's message doorbell, checking every readerCheckEvery that its peers are alive.
func (m *messenger) read() {
	defer close(m.stopped)
	g := m.g
	bell := g.bell(g.rank, rMsgBell)
	var pending []transport.Msg
	checked := time.Now()
	for {
		for len(pending) > 0 {
			select {
			case m.inbox <- pending[0]:
				pending[0] = transport.Msg{}
				pending = pending[1:]
			case <-m.stop:
				return
			}
		}
		if m.stopping.Load() {
			return
		}
		g.mu.RLock()
		pending = m.drain(pending)
		if len(pending) == 0 {
			if !spinUntil(m.arrived, min(g.spin(), readerSpin), 0) {
				bell.sleep(m.arrived, readerCheckEvery)
			}
			procs := time.Since(checked) >= readerCheckEvery
			if procs {
				checked = time.Now()
			}
			pending = m.checkPeers(pending, procs)
		}
		g.mu.RUnlock()
	}
}

// arrived reports whether a message may be waiting (or the messenger is closing): the reader's and
// Sleep's wake-up condition.
func (m *messenger) arrived() bool {
	if m.stopping.Load() || m.selfN.Load() > 0 {
		return true
	}
	for p := range m.recv {
		if p != m.g.rank && m.recv[p].data != nil && m.recv[p].readable() {
			return true
		}
	}
	return false
}

// TryRecv implements transport.Poller: it decodes whatever the rings hold and returns the oldest
// message. When nothing has arrived it checks the peers, as the reader goroutine would after a
// wake-up: their state words every time, their processes every readerCheckEvery.
func (m *messenger) TryRecv() (transport.Msg, bool, error) {
	g := m.g
	if m.mode.Load() != readPolled && !m.mode.CompareAndSwap(readUnchosen, readPolled) {
		return transport.Msg{}, false, fmt.Errorf("shm: rank %d: TryRecv on a messenger already read through Inbox", g.rank)
	}
	m.readMu.Lock()
	defer m.readMu.Unlock()
	if len(m.polled) == 0 {
		g.mu.RLock()
		if g.msgClosed.Load() {
			g.mu.RUnlock()
			return transport.Msg{}, false, fmt.Errorf("shm: rank %d: receive message: %w", g.rank, transport.ErrClosed)
		}
		m.polled = m.drain(m.polled[:0])
		if len(m.polled) == 0 {
			// A spinning caller polls every few hundred nanoseconds: reading the clock each time
			// would be a good part of that, so it is read every pollsPerClock empty polls (or
			// after a Sleep, which sets empties so).
			procs := false
			if m.empties++; m.empties >= pollsPerClock {
				m.empties = 0
				now := time.Now()
				if m.checked.IsZero() {
					m.checked = now
				}
				if procs = now.Sub(m.checked) >= readerCheckEvery; procs {
					m.checked = now
				}
			}
			m.polled = m.checkPeers(m.polled, procs)
		}
		g.mu.RUnlock()
		if len(m.polled) == 0 {
			return transport.Msg{}, false, nil
		}
	}
	msg := m.polled[0]
	m.polled[0] = transport.Msg{}
	m.polled = m.polled[1:]
	return msg, true, nil
}

// Sleep implements transport.Poller: it sleeps on this rank's message doorbell, which every sender
// rings after it publishes, Wake rings, and Close kicks.
func (m *messenger) Sleep(ready func() bool, d time.Duration) {
	g := m.g
	m.readMu.Lock()
	defer m.readMu.Unlock()
	g.mu.RLock()
	defer g.mu.RUnlock()
	if g.released || len(m.polled) > 0 {
		return
	}
	g.bell(g.rank, rMsgBell).sleep(func() bool { return m.arrived() || ready() }, d)
	m.empties = pollsPerClock // the next empty TryRecv reads the clock
}

// Wake implements transport.Poller.
func (m *messenger) Wake() {
	g := m.g
	g.mu.RLock()
	if !g.released {
		g.bell(g.rank, rMsgBell).ring()
	}
	g.mu.RUnlock()
}

// relieve is for a SendMsg waiting for room in a peer's ring: when the messenger is polled, it
// decodes what has arrived into the polled queue. The goroutine blocked in SendMsg is then usually
// the one that would otherwise read (the engine sends from its loop), and the peer may be blocked
// sending to this rank at the same time: without this, two long messages crossing would wait on
// each other for ever. Draining frees the peer's ring and rings its space doorbell, so it does the
// same for us. The caller holds g.mu shared.
func (m *messenger) relieve() {
	if m.mode.Load() != readPolled || !m.readMu.TryLock() {
		return
	}
	m.polled = m.drain(m.polled)
	m.readMu.Unlock()
}

// drain decodes everything now in the rings and the self queue.
func (m *messenger) drain(pending []transport.Msg) []transport.Msg {
	g := m.g
	for p := range m.recv {
		if p == g.rank || m.recv[p].data == nil {
			continue
		}
		r := &m.recv[p]
		a, b := r.peek()
		if len(a) == 0 {
			continue
		}
		emit := func(body []byte) { pending = append(pending, transport.Msg{From: p, Body: body}) }
		err := m.dec[p].feed(a, emit)
		if err == nil {
			err = m.dec[p].feed(b, emit)
		}
		if err != nil {
			// A corrupt stream cannot be resynchronised: stop reading this peer.
			r.data = nil
			pending = m.markLost(pending, p, &transport.PeerError{Rank: p, Op: "recv",
				Err: fmt.Errorf("message stream from rank %d: %w", p, err)})
			continue
		}
		r.skip(len(a) + len(b))
	}
	if m.selfN.Load() > 0 {
		m.selfMu.Lock()
		for _, body := range m.selfQ {
			pending = append(pending, transport.Msg{From: g.rank, Body: body})
		}
		m.selfN.Add(-int32(len(m.selfQ)))
		m.selfQ = nil
		m.selfMu.Unlock()
	}
	return pending
}

// checkPeers reports peers that closed their Messenger or (if procs) whose process exited, once
// everything they sent has been read: the state is read before the ring, and a peer publishes its
// last message before it closes.
func (m *messenger) checkPeers(pending []transport.Msg, procs bool) []transport.Msg {
	g := m.g
	for p := range m.recv {
		if p == g.rank || m.recv[p].data == nil {
			continue
		}
		err := g.peerGone(p, "recv", stateMsgClosed, procs)
		if err == nil || m.recv[p].readable() {
			continue
		}
		if m.dec[p].midFrame() {
			pe := err.(*transport.PeerError)
			pe.Err = fmt.Errorf("%w, in the middle of a message", pe.Err)
		}
		m.recv[p].data = nil
		pending = m.markLost(pending, p, err)
	}
	return pending
}

func (m *messenger) markLost(pending []transport.Msg, p int, err error) []transport.Msg {
	m.lostMu.Lock()
	if m.lost[p] == nil {
		m.lost[p] = err
	}
	m.lostMu.Unlock()
	return append(pending, transport.Msg{From: p, Body: nil})
}

// beginStop tells the reader, if it runs, to stop; the caller then rings the doorbell it may sleep
// on.
func (m *messenger) beginStop() {
	m.modeMu.Lock()
	m.stopping.Store(true)
	m.modeMu.Unlock()
	close(m.stop)
}

// endStop waits for the reader to exit and closes the inbox.
func (m *messenger) endStop() {
	m.modeMu.Lock()
	started := m.started
	m.modeMu.Unlock()
	if started {
		<-m.stopped
	}
	close(m.inbox)
}

// Close closes the Messenger half: the reader stops, Inbox is closed, and peers see this rank lost.
func (m *messenger) Close() error {
	m.g.closeHalf(stateMsgClosed)
	return nil
}
