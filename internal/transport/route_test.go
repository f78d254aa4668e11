package transport_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/transport"
	"github.com/kolo-dl/kolo/internal/transport/inmem"
)

// polling is a Messenger with the Poller capability that counts Inbox calls: a Poller must not be
// read through Inbox behind its owner's back.
type polling struct {
	transport.Messenger
	inboxCalls atomic.Int32
}

func (p *polling) Inbox() <-chan transport.Msg {
	p.inboxCalls.Add(1)
	return p.Messenger.Inbox()
}
func (p *polling) TryRecv() (transport.Msg, bool, error) { return transport.Msg{}, false, nil }
func (p *polling) Sleep(func() bool, time.Duration)      {}
func (p *polling) Wake()                                 {}

func TestPollerOf(t *testing.T) {
	eps := inmem.New(3)
	defer func() {
		for _, e := range eps {
			e.Close()
		}
	}()
	p := &polling{Messenger: eps[0]}
	other := &polling{Messenger: eps[0]}
	links := func(m ...transport.Messenger) []transport.Link {
		ls := make([]transport.Link, 3)
		for r := range ls {
			ls[r] = transport.Link{Comm: eps[0], Messenger: m[r%len(m)], Peer: r}
		}
		return ls
	}
	renumbered := links(p)
	renumbered[1].Peer, renumbered[2].Peer = 2, 1
	for _, tc := range []struct {
		name string
		m    transport.Messenger
		want transport.Poller // nil: no capability
	}{
		{"plain messenger", eps[0], nil},
		{"poller", p, p},
		{"route handing one poller through", transport.NewRoute(0, links(p)), p},
		{"route renumbering its peers", transport.NewRoute(0, renumbered), nil},
		{"route merging two messengers", transport.NewRoute(0, links(p, other)), nil},
		{"route over a plain messenger", transport.NewRoute(0, links(eps[0])), nil},
	} {
		got, ok := transport.PollerOf(tc.m)
		if ok != (tc.want != nil) || got != tc.want {
			t.Errorf("%s: PollerOf = %v, %v; want %v", tc.name, got, ok, tc.want)
		}
		if r, isRoute := tc.m.(*transport.Route); isRoute {
			r.Close()
		}
	}
}

// A route that hands one messenger through asks for its Inbox only when its own is asked for, so
// that an owner reading through PollerOf never starts the messenger's reader.
func TestRouteAsksInboxLazily(t *testing.T) {
	eps := inmem.New(2)
	defer eps[0].Close()
	defer eps[1].Close()
	p := &polling{Messenger: eps[0]}
	r := transport.NewRoute(0, []transport.Link{{}, {Comm: eps[0], Messenger: p, Peer: 1}})
	defer r.Close()
	if n := p.inboxCalls.Load(); n != 0 {
		t.Fatalf("NewRoute called Inbox %d times", n)
	}
	if err := eps[1].SendMsg(t.Context(), 0, []byte("hi")); err != nil {
		t.Fatal(err)
	}
	if m := <-r.Inbox(); m.From != 1 || string(m.Body) != "hi" {
		t.Fatalf("got %+v through the route's inbox", m)
	}
	if n := p.inboxCalls.Load(); n != 1 {
		t.Fatalf("Inbox called %d times, want 1", n)
	}
}
