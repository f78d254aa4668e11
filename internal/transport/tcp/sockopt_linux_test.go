package tcp

import (
	"bytes"
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/transport"
)

func userTimeoutOf(t *testing.T, c conn) time.Duration {
	raw, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var v int
	var gerr error
	raw.Control(func(fd uintptr) { v, gerr = syscall.GetsockoptInt(int(fd), syscall.IPPROTO_TCP, tcpUserTimeout) })
	if gerr != nil {
		t.Fatal(gerr)
	}
	return time.Duration(v) * time.Millisecond
}

// A rank that stops reading for longer than TCP_USER_TIMEOUT (a straggler, a long checkpoint) is
// alive: its peers' blocked Sends must wait for it, not declare it lost. Only the control lane,
// which is always drained, carries the user timeout.
func TestStalledReceiverIsNotLost(t *testing.T) {
	w := connectAllWith(t, 2, 2, ChunkSize, func(cfg *Config) { cfg.userTimeout = 400 * time.Millisecond })
	w.linkAll(t)
	for _, m := range w.ms {
		p := m.peers[1-m.rank]
		if got := userTimeoutOf(t, p.ctrl); got != 400*time.Millisecond {
			t.Errorf("rank %d control connection: TCP_USER_TIMEOUT %s", m.rank, got)
		}
		for s, c := range p.out.conns {
			if got := userTimeoutOf(t, c); got != 0 {
				t.Errorf("rank %d data stream %d: TCP_USER_TIMEOUT %s, want unset", m.rank, s, got)
			}
		}
	}

	const size = 96 << 20 // far more than the socket buffers of both streams hold
	data := make([]byte, size)
	for off := 0; off < size; off += len(pool) {
		copy(data[off:], pool)
	}
	sent := make(chan error, 1)
	go func() { sent <- w.ms[0].Comm().Send(context.Background(), 1, data) }()
	time.Sleep(1500 * time.Millisecond)
	select {
	case err := <-sent:
		t.Fatalf("Send finished while the receiver was not reading: %v", err)
	default:
	}
	got := make([]byte, size)
	if err := w.ms[1].Comm().Recv(context.Background(), 0, got); err != nil {
		t.Fatal(err)
	}
	if err := <-sent; err != nil {
		t.Fatalf("Send to a stalled, live receiver: %v", err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("data differs")
	}
}

// A progress timeout shorter than DefaultUserTimeout shortens the control lane's user timeout and
// keepalive with it (a vanished host is noticed as soon as a stuck one), never below
// transport.MinDeadHostTimeout; a longer one, or none, leaves the default.
func TestControlTimeoutFollowsProgressTimeout(t *testing.T) {
	for _, tc := range []struct{ progress, want time.Duration }{
		{-1, DefaultUserTimeout},
		{time.Minute, DefaultUserTimeout},
		{3 * time.Second, 3 * time.Second},
		{500 * time.Millisecond, transport.MinDeadHostTimeout},
	} {
		w := connectAllWith(t, 2, 1, ChunkSize, func(cfg *Config) { cfg.ProgressTimeout = tc.progress })
		w.linkAll(t)
		for r, m := range w.ms {
			if got := userTimeoutOf(t, m.peers[1-r].ctrl); got != tc.want {
				t.Errorf("progress timeout %s: rank %d: control TCP_USER_TIMEOUT %s, want %s", tc.progress, r, got, tc.want)
			}
		}
		if ka := ctrlKeepAlive(tc.want); ka*keepAliveCount > tc.want+keepAliveIdle || ka > tc.want/2 {
			t.Errorf("user timeout %s: keepalive every %s does not probe within it", tc.want, ka)
		}
	}
}
