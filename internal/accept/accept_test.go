package accept

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"
)

// flaky fails its first Accepts with EMFILE, then accepts from a real listener.
type flaky struct {
	net.Listener
	mu    sync.Mutex
	fails int
}

func (f *flaky) Accept() (net.Conn, error) {
	f.mu.Lock()
	if f.fails > 0 {
		f.fails--
		f.mu.Unlock()
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: syscall.EMFILE}
	}
	f.mu.Unlock()
	return f.Listener.Accept()
}

func TestLoopSurvivesAcceptErrorsAndEndsOnClose(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fl := &flaky{Listener: ln, fails: 3}
	got := make(chan net.Conn, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		Loop(fl, slog.New(slog.NewTextHandler(io.Discard, nil)), "test", func(c net.Conn) bool { got <- c; return true })
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	select {
	case s := <-got:
		s.Close()
	case <-time.After(5 * time.Second):
		t.Fatal("no connection handed over after 3 failed accepts")
	}
	ln.Close()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Loop did not return after the listener closed")
	}
}

func TestLoopStopsAndClosesWhenRefused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		Loop(ln, slog.Default(), "test", func(net.Conn) bool { return false })
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Loop did not return when take refused")
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Errorf("refused connection: read gave %v, want EOF (closed by Loop)", err)
	}
}
