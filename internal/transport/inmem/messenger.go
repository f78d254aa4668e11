package inmem

import (
	"context"
	"fmt"
	"sync"

	"github.com/kolo-dl/kolo/internal/transport"
)

// mailbox is an unbounded queue of messages for one endpoint. Unbounded so that SendMsg never
// blocks on a slow receiver (the engine sends from its loop), and so that a loss notice always
// fits behind the messages the lost rank sent before it.
type mailbox struct {
	mu     sync.Mutex
	q      []transport.Msg
	notify chan struct{}
}

func (m *mailbox) put(msg transport.Msg) {
	m.mu.Lock()
	m.q = append(m.q, msg)
	m.mu.Unlock()
	signal(m.notify)
}

func (m *mailbox) take() (transport.Msg, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.q) == 0 {
		return transport.Msg{}, false
	}
	msg := m.q[0]
	m.q[0] = transport.Msg{}
	m.q = m.q[1:]
	return msg, true
}

// SendMsg queues a copy of body for peer. It does not block.
func (e *Endpoint) SendMsg(ctx context.Context, peer int, body []byte) error {
	if err := e.checkPeer(peer, "send message to"); err != nil {
		return err
	}
	if err := e.selfErr("send message"); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("inmem: rank %d: send message to rank %d: %w", e.rank, peer, err)
	}
	p := e.g.eps[peer]
	if p.isKilled() {
		return e.peerKilledErr(peer, "send message")
	}
	if p.isClosed() {
		return &transport.PeerError{Rank: peer, Op: "send message", Err: transport.ErrClosed}
	}
	// A nil body is reserved for loss notices, so an empty message travels as an empty non-nil slice.
	p.mail.put(transport.Msg{From: e.rank, Body: append(make([]byte, 0, len(body)), body...)})
	return nil
}

// Inbox delivers messages from every peer, and Msg{From: r, Body: nil} once when rank r is killed.
// It is closed by Close.
func (e *Endpoint) Inbox() <-chan transport.Msg {
	e.pumpMu.Lock()
	if !e.pumping && !e.inboxShut {
		e.pumping = true
		go e.pump()
	}
	e.pumpMu.Unlock()
	return e.inbox
}

// pump moves messages from the unbounded mailbox to the Inbox channel. It is started by the first
// Inbox call, so that endpoints whose Messenger is never used leave no goroutine behind.
func (e *Endpoint) pump() {
	defer close(e.inbox)
	for {
		msg, ok := e.mail.take()
		if !ok {
			select {
			case <-e.mail.notify:
				continue
			case <-e.closed:
				return
			}
		}
		select {
		case e.inbox <- msg:
		case <-e.closed:
			return
		}
	}
}

// Lost returns a *transport.PeerError when peer was killed, and nil otherwise (a peer that closed
// gracefully is not lost).
func (e *Endpoint) Lost(peer int) error {
	if peer < 0 || peer >= e.g.size {
		return fmt.Errorf("inmem: rank %d: lost: rank %d out of range [0,%d)", e.rank, peer, e.g.size)
	}
	if p := e.g.eps[peer]; p.isKilled() {
		return &transport.PeerError{Rank: peer, Op: "kill", Err: p.killErr}
	}
	return nil
}
