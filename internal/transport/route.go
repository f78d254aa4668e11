package transport

import (
	"context"
	"fmt"
	"sync"
)

// Link says how to reach one peer: through Comm (and its Messenger), where the peer is rank Peer.
type Link struct {
	Comm      Comm
	Messenger Messenger
	Peer      int // the peer's rank inside Comm/Messenger
}

// Route is a Comm and a Messenger over a whole group whose peers are reached through different
// transports: shared memory for ranks of this host, TCP for the rest. Links[r] says how to reach
// rank r (Links[self] is ignored).
type Route struct {
	rank   int
	links  []Link
	inbox  chan Msg
	direct Messenger // set when forwarding is not needed: this messenger's inbox is the route's
	stop   chan struct{}
	wg     sync.WaitGroup
	once   sync.Once
}

// NewRoute builds the routed group. Every distinct Messenger's inbox is forwarded into one, with
// peers renumbered to ranks of the whole group.
func NewRoute(rank int, links []Link) *Route {
	r := &Route{rank: rank, links: links, inbox: make(chan Msg, 256), stop: make(chan struct{})}
	// Map each messenger's local peer numbers back to group ranks.
	back := map[Messenger]map[int]int{}
	for g, l := range links {
		if g == rank || l.Messenger == nil {
			continue
		}
		if back[l.Messenger] == nil {
			back[l.Messenger] = map[int]int{}
		}
		back[l.Messenger][l.Peer] = g
	}
	// One messenger that already numbers peers as the group does (every rank on one host): hand
	// out its inbox directly, saving a goroutine hop on every control message. Its Inbox is asked
	// for only when the route's is, so a caller may read it through PollerOf instead.
	if len(back) == 1 {
		for m, ranks := range back {
			identity := true
			for local, g := range ranks {
				identity = identity && local == g
			}
			if identity {
				r.direct = m
				return r
			}
		}
	}
	for m, ranks := range back {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			for {
				select {
				case msg, ok := <-m.Inbox():
					if !ok {
						return
					}
					g, known := ranks[msg.From]
					if !known {
						continue
					}
					msg.From = g
					select {
					case r.inbox <- msg:
					case <-r.stop:
						return
					}
				case <-r.stop:
					return
				}
			}
		}()
	}
	return r
}

func (r *Route) Rank() int { return r.rank }
func (r *Route) Size() int { return len(r.links) }

func (r *Route) link(peer int) (Link, error) {
	if peer < 0 || peer >= len(r.links) || peer == r.rank || r.links[peer].Comm == nil {
		return Link{}, fmt.Errorf("route: no link from rank %d to rank %d", r.rank, peer)
	}
	return r.links[peer], nil
}

func (r *Route) Send(ctx context.Context, peer int, b []byte) error {
	l, err := r.link(peer)
	if err != nil {
		return err
	}
	return renumber(l.Comm.Send(ctx, l.Peer, b), l.Peer, peer)
}

func (r *Route) Recv(ctx context.Context, peer int, b []byte) error {
	l, err := r.link(peer)
	if err != nil {
		return err
	}
	return renumber(l.Comm.Recv(ctx, l.Peer, b), l.Peer, peer)
}

func (r *Route) SendRecv(ctx context.Context, to int, sb []byte, from int, rb []byte) error {
	lt, err := r.link(to)
	if err != nil {
		return err
	}
	lf, err := r.link(from)
	if err != nil {
		return err
	}
	if lt.Comm == lf.Comm {
		return renumber(renumber(lt.Comm.SendRecv(ctx, lt.Peer, sb, lf.Peer, rb), lt.Peer, to), lf.Peer, from)
	}
	// Different transports: run the send beside the receive so neither waits on the other.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sent := make(chan error, 1)
	go func() { sent <- renumber(lt.Comm.Send(ctx, lt.Peer, sb), lt.Peer, to) }()
	rerr := renumber(lf.Comm.Recv(ctx, lf.Peer, rb), lf.Peer, from)
	if rerr != nil {
		cancel()
		<-sent
		return rerr
	}
	return <-sent
}

// SendMsg and the rest implement Messenger.
func (r *Route) SendMsg(ctx context.Context, peer int, body []byte) error {
	if peer < 0 || peer >= len(r.links) || r.links[peer].Messenger == nil {
		return fmt.Errorf("route: no messenger from rank %d to rank %d", r.rank, peer)
	}
	l := r.links[peer]
	return renumber(l.Messenger.SendMsg(ctx, l.Peer, body), l.Peer, peer)
}

func (r *Route) Inbox() <-chan Msg {
	if r.direct != nil {
		return r.direct.Inbox()
	}
	return r.inbox
}

func (r *Route) Lost(peer int) error {
	if peer < 0 || peer >= len(r.links) || r.links[peer].Messenger == nil {
		return nil
	}
	l := r.links[peer]
	return renumber(l.Messenger.Lost(l.Peer), l.Peer, peer)
}

// Close stops forwarding; it does not close the underlying transports (their owner does).
func (r *Route) Close() error {
	r.once.Do(func() { close(r.stop) })
	r.wg.Wait()
	return nil
}

// renumber rewrites a PeerError's or a StallError's rank from the transport's numbering to the
// group's.
func renumber(err error, local, group int) error {
	if err == nil || local == group {
		return err
	}
	switch e := err.(type) {
	case *PeerError:
		if e.Rank == local {
			cp := *e
			cp.Rank = group
			return &cp
		}
	case *StallError:
		if e.Rank == local {
			cp := *e
			cp.Rank = group
			return &cp
		}
	}
	return err
}
