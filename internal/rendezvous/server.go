package rendezvous

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kolo-dl/kolo/internal/accept"
	"github.com/kolo-dl/kolo/internal/auth"
	"github.com/kolo-dl/kolo/internal/endpoint"
	"github.com/kolo-dl/kolo/internal/sockopt"
)

// HandshakeTimeout bounds how long an accepted connection may take to prove it knows the secret.
const HandshakeTimeout = 5 * time.Second

// Server serves a Store to authenticated Clients over TCP or Unix sockets. The embedded Store is
// the launcher's in-process view of the same data (s.Set, s.Get, s.Add, s.TryGet).
type Server struct {
	*Store
	secret           []byte
	log              *slog.Logger
	handshakeTimeout time.Duration

	requests atomic.Int64  // frames served, for the start-up scaling table
	liveness time.Duration // SetLiveness; 0: the kernel's defaults

	gate *accept.Gate // strangers' failed handshakes: logged at a bounded rate, repeat offenders refused

	mu     sync.Mutex
	lns    []net.Listener
	conns  map[*serverConn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// NewServer returns a Server with an empty Store that admits only peers knowing secret.
func NewServer(secret []byte) *Server {
	return newServer(secret, slog.Default(), HandshakeTimeout)
}

func newServer(secret []byte, log *slog.Logger, handshakeTimeout time.Duration) *Server {
	return &Server{
		Store:            NewStore(),
		secret:           append([]byte(nil), secret...),
		log:              log,
		handshakeTimeout: handshakeTimeout,
		gate:             accept.NewGate("rendezvous", log, accept.GatePolicy{}),
		conns:            map[*serverConn]struct{}{},
	}
}

// SetLiveness makes the server give up on a client whose host stops acknowledging for d (it
// vanished, or its link was cut): keepalive probes an idle connection and TCP_USER_TIMEOUT ends it,
// its parked calls, and its session records (Client.SetSession). A client process that is merely
// stopped or busy is not affected: its kernel still answers. Call it before Listen.
func (s *Server) SetLiveness(d time.Duration) { s.liveness = d }

// Listen starts serving on addr (":0" picks a port; a path is a Unix socket, endpoint.IsUnix) in
// the background and returns the bound address.
// It may be called again for another address (a launcher listens on each address it gives its
// workers, not on every interface); every listener serves the same Store.
func (s *Server) Listen(addr string) (net.Addr, error) {
	if len(s.secret) == 0 {
		return nil, errors.New("rendezvous listen: empty job secret")
	}
	ln, err := endpoint.Listen(addr)
	if err != nil {
		return nil, fmt.Errorf("rendezvous listen on %s: %w", addr, err)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		ln.Close()
		return nil, fmt.Errorf("rendezvous listen on %s: %w", addr, ErrClosed)
	}
	gated := s.gate.Wrap(ln)
	s.lns = append(s.lns, gated)
	s.wg.Add(1)
	s.mu.Unlock()
	go s.accept(gated)
	return ln.Addr(), nil
}

func (s *Server) accept(ln net.Listener) {
	defer s.wg.Done()
	accept.Loop(ln, s.log, "rendezvous", func(c net.Conn) bool {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return false
		}
		if tc, ok := c.(*net.TCPConn); ok && s.liveness > 0 {
			probe := min(max(s.liveness/4, 100*time.Millisecond), 5*time.Second)
			tc.SetKeepAliveConfig(net.KeepAliveConfig{Enable: true, Idle: probe, Interval: probe, Count: 5})
			sockopt.UserTimeout(tc, s.liveness)
		}
		sc := &serverConn{s: s, c: c, wake: make(chan struct{}, 1), parked: map[uint64]func() bool{}}
		s.conns[sc] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		// The handshake runs beside the accept loop so that a silent or slow peer cannot stall it.
		go sc.serve()
		return true
	})
}

// Requests is the number of requests the server has handled, from every client: what a job's
// start-up costs the rendezvous.
func (s *Server) Requests() int64 { return s.requests.Load() }

// Close stops listening, drops every connection (their pending calls fail) and closes the Store.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	var err error
	for _, ln := range s.lns {
		err = errors.Join(err, ln.Close())
	}
	for sc := range s.conns {
		sc.c.Close()
	}
	s.mu.Unlock()
	s.Store.Close()
	s.wg.Wait()
	s.gate.Close()
	return err
}

// serverConn is one client connection: a reader that executes requests in order and a writer that
// sends responses, so that a Set answering many parked Gets never blocks on a slow client.
type serverConn struct {
	s *Server
	c net.Conn

	mu      sync.Mutex
	out     []frame
	done    bool
	wake    chan struct{}
	parked  map[uint64]func() bool // request id -> cancel of a parked Get
	session map[string][]byte      // records this connection set with SetSession (read loop only)
}

func (sc *serverConn) serve() {
	defer sc.s.wg.Done()
	defer func() {
		sc.s.mu.Lock()
		delete(sc.s.conns, sc)
		sc.s.mu.Unlock()
	}()
	defer sc.c.Close()
	remote := sc.c.RemoteAddr().String()
	if err := auth.Handshake(sc.c, sc.s.secret, auth.Listener, sc.s.handshakeTimeout); err != nil {
		sc.s.gate.Rejected(sc.c, "authentication", err)
		return
	}
	sc.s.gate.Authenticated(sc.c)
	// The client's side of the handshake ends when it has checked our proof, which may be before
	// we read its own: on a loaded host our deadline can pass in between, and a client that took
	// the connection for accepted would lose its first request. It waits for this byte instead.
	sc.c.SetWriteDeadline(time.Now().Add(sc.s.handshakeTimeout))
	if _, err := sc.c.Write([]byte{acceptedByte}); err != nil {
		sc.s.log.Warn("rendezvous: dropped connection before its first request", "remote", remote, "err", err)
		return
	}
	sc.c.SetWriteDeadline(time.Time{})
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		sc.writeLoop()
	}()
	err := sc.readLoop()
	if err != nil && !errors.Is(err, net.ErrClosed) {
		sc.s.log.Warn("rendezvous: dropped connection", "remote", remote, "err", err)
	}
	sc.mu.Lock()
	sc.done = true
	parked := sc.parked
	sc.parked = nil
	sc.mu.Unlock()
	for _, cancel := range parked {
		cancel()
	}
	for k, v := range sc.session {
		sc.s.Store.deleteIf(k, v)
	}
	sc.c.Close()
	select {
	case sc.wake <- struct{}{}:
	default:
	}
	<-writerDone
}

func (sc *serverConn) readLoop() error {
	r := bufio.NewReaderSize(sc.c, 64<<10)
	for {
		f, err := readFrame(r)
		if err != nil {
			if errors.Is(err, errFrame) {
				return err
			}
			return nil // EOF or a closed connection: the client went away
		}
		sc.handle(f)
	}
}

func (sc *serverConn) handle(f frame) {
	sc.s.requests.Add(1)
	st := sc.s.Store
	switch f.verb {
	case verbSet:
		if err := st.Set(f.key, f.value); err != nil {
			sc.reply(frame{id: f.id, verb: verbError, value: []byte(err.Error())})
			return
		}
		sc.reply(frame{id: f.id, verb: verbOK})
	case verbSetSession:
		if err := st.Set(f.key, f.value); err != nil {
			sc.reply(frame{id: f.id, verb: verbError, value: []byte(err.Error())})
			return
		}
		if sc.session == nil {
			sc.session = map[string][]byte{}
		}
		sc.session[f.key] = append([]byte(nil), f.value...)
		sc.reply(frame{id: f.id, verb: verbOK})
	case verbSetIfAbsent:
		stored, err := st.SetIfAbsent(f.key, f.value)
		if err != nil {
			sc.reply(frame{id: f.id, verb: verbError, value: []byte(err.Error())})
			return
		}
		ans := []byte{0}
		if stored {
			ans[0] = 1
		}
		sc.reply(frame{id: f.id, verb: verbValue, value: ans})
	case verbTryGet:
		v, ok, err := st.peek(f.key)
		switch {
		case err != nil:
			sc.reply(frame{id: f.id, verb: verbError, value: []byte(err.Error())})
		case !ok:
			sc.reply(frame{id: f.id, verb: verbMissing})
		default:
			sc.reply(frame{id: f.id, verb: verbValue, value: v})
		}
	case verbGet, verbGather:
		id := f.id
		// A gather this request completes wakes its members after sc.mu is released: some may be
		// parked on this connection, and their fire takes sc.mu.
		var wake func()
		defer func() {
			if wake != nil {
				wake()
			}
		}()
		// Registered under sc.mu so that fire, which removes the entry, cannot run before it exists.
		sc.mu.Lock()
		defer sc.mu.Unlock()
		if sc.done {
			return
		}
		park := st.wait
		if f.verb == verbGather {
			if len(f.value) < 8 {
				sc.replyLocked(frame{id: id, verb: verbError, value: []byte(fmt.Sprintf("gather %q: value of %d bytes, want at least 8", f.key, len(f.value)))})
				return
			}
			n, i := int(binary.BigEndian.Uint32(f.value)), int(binary.BigEndian.Uint32(f.value[4:]))
			value := f.value[8:]
			park = func(key string, fire func([]byte, error)) (table []byte, ok bool, cancel func() bool, err error) {
				table, ok, cancel, wake, err = st.gather(key, n, i, value, fire)
				return table, ok, cancel, err
			}
		}
		v, ok, cancel, err := park(f.key, func(val []byte, err error) {
			sc.mu.Lock()
			delete(sc.parked, id)
			sc.mu.Unlock()
			if err != nil {
				sc.reply(frame{id: id, verb: verbError, value: []byte(err.Error())})
				return
			}
			sc.reply(frame{id: id, verb: verbValue, value: val})
		})
		switch {
		case err != nil:
			sc.replyLocked(frame{id: id, verb: verbError, value: []byte(err.Error())})
		case ok:
			sc.replyLocked(frame{id: id, verb: verbValue, value: v})
		default:
			sc.parked[id] = cancel
		}
	case verbCancel:
		sc.mu.Lock()
		cancel := sc.parked[f.id]
		delete(sc.parked, f.id)
		sc.mu.Unlock()
		if cancel != nil {
			cancel()
		}
	case verbAdd:
		if len(f.value) != 8 {
			sc.reply(frame{id: f.id, verb: verbError, value: []byte(fmt.Sprintf("add %q: delta of %d bytes, want 8", f.key, len(f.value)))})
			return
		}
		n, err := st.Add(f.key, int64(binary.BigEndian.Uint64(f.value)))
		if err != nil {
			sc.reply(frame{id: f.id, verb: verbError, value: []byte(err.Error())})
			return
		}
		sc.reply(frame{id: f.id, verb: verbValue, value: binary.BigEndian.AppendUint64(nil, uint64(n))})
	default:
		sc.reply(frame{id: f.id, verb: verbError, value: []byte(fmt.Sprintf("unknown request %v", f.verb))})
	}
}

func (sc *serverConn) reply(f frame) {
	sc.mu.Lock()
	sc.replyLocked(f)
	sc.mu.Unlock()
}

func (sc *serverConn) replyLocked(f frame) {
	if sc.done {
		return
	}
	sc.out = append(sc.out, f)
	select {
	case sc.wake <- struct{}{}:
	default:
	}
}

func (sc *serverConn) writeLoop() {
	w := bufio.NewWriterSize(sc.c, 64<<10)
	var hdr []byte
	var batch []frame
	for range sc.wake {
		sc.mu.Lock()
		batch, sc.out = sc.out, batch[:0]
		done := sc.done
		sc.mu.Unlock()
		if done {
			return
		}
		for i, f := range batch {
			hdr = appendHeader(hdr[:0], f)
			w.Write(hdr)
			w.Write(f.value)
			batch[i] = frame{} // drop the reference to a possibly large value
		}
		if err := w.Flush(); err != nil {
			sc.c.Close() // the reader notices and cleans up
			return
		}
	}
}
