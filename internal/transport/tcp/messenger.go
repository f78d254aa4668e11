package tcp

import (
	"bufio"
	"context"
	"fmt"
	"time"

	"github.com/kolo-dl/kolo/internal/transport"
)

// messenger is the Mesh seen as a transport.Messenger: one control connection per peer, each read
// by its own goroutine into the shared inbox, so messages from one sender stay in order.
type messenger Mesh

var _ transport.Messenger = (*messenger)(nil)

func (ms *messenger) Inbox() <-chan transport.Msg { return ms.inbox }
func (ms *messenger) Close() error                { return (*Mesh)(ms).Close() }

// Lost returns why communication with peer ended, or nil while it is healthy.
func (ms *messenger) Lost(peer int) error {
	if peer < 0 || peer >= ms.size || ms.peers[peer] == nil {
		return fmt.Errorf("rank %d: rank %d is not a peer in this tcp mesh", ms.rank, peer)
	}
	if pe := ms.peers[peer].lost.Load(); pe != nil {
		return pe
	}
	return nil
}

// keepCtrlBuf bounds the send buffer a peer keeps between messages.
const keepCtrlBuf = 1 << 20

// SendMsg writes body to peer's control connection as one frame.
func (ms *messenger) SendMsg(ctx context.Context, peer int, body []byte) error {
	m := (*Mesh)(ms)
	m.opMu.RLock()
	defer m.opMu.RUnlock()
	const op = "send message"
	if len(body) > MaxMsg {
		return fmt.Errorf("rank %d: send message of %d bytes to rank %d: larger than %d", m.rank, len(body), peer, MaxMsg)
	}
	p, err := m.peerFor(ctx, peer, op)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("rank %d: %s to rank %d: %w", m.rank, op, peer, err)
	}
	p.ctrlMu.Lock()
	defer p.ctrlMu.Unlock()
	if pe := p.lost.Load(); pe != nil {
		return &transport.PeerError{Rank: p.rank, Host: p.host, Op: op, Err: pe.Err}
	}
	buf := appendMsg(p.ctrlBuf[:0], body)
	if cap(buf) <= keepCtrlBuf {
		p.ctrlBuf = buf[:0]
	}
	var fired chan struct{}
	var stop func() bool
	if ctx.Done() != nil {
		fired = make(chan struct{})
		stop = context.AfterFunc(ctx, func() {
			p.ctrl.SetWriteDeadline(aLongTimeAgo)
			close(fired)
		})
	}
	n, err := p.ctrl.Write(buf)
	if stop != nil && !stop() {
		<-fired
		p.ctrl.SetWriteDeadline(time.Time{})
		if err != nil {
			if n > 0 {
				p.markLost(op, fmt.Errorf("message cancelled after %d of %d bytes, stream out of step: %w", n, len(buf), ctx.Err()))
			}
			return fmt.Errorf("rank %d: %s to rank %d: %w", m.rank, op, peer, ctx.Err())
		}
	}
	if err != nil {
		return p.markLost(op, err)
	}
	return nil
}

// readControl delivers the peer's messages until its connection ends, then, unless the mesh is
// closing, marks the peer lost and delivers the one Msg with a nil Body that says so.
func (p *peer) readControl() {
	m := p.m
	defer m.wg.Done()
	r := bufio.NewReaderSize(p.ctrl, 64<<10)
	for {
		body, err := readMsg(r)
		if err != nil {
			if m.closed.Load() {
				return
			}
			p.markLost("recv message", err)
			select {
			case m.inbox <- transport.Msg{From: p.rank}:
			case <-m.quit:
			}
			return
		}
		select {
		case m.inbox <- transport.Msg{From: p.rank, Body: body}:
		case <-m.quit:
			return
		}
	}
}
