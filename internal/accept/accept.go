// Package accept is what every kolo listener (the rendezvous server, the TCP transport) runs at its
// door: the accept loop, which keeps serving through transient accept errors and ends when the
// listener closes, and the Gate, which bounds what strangers' connections cost the job.
package accept

import (
	"errors"
	"log/slog"
	"net"
	"time"
)

// Backoff bounds the pause after a failed Accept (out of file descriptors and the like): short at
// first, so a brief shortage costs little, and at most maxBackoff, so the loop never spins.
const (
	minBackoff = 5 * time.Millisecond
	maxBackoff = time.Second
)

// Loop accepts connections on ln until ln is closed and hands each to take. take returns false
// when its owner is shutting down; Loop then closes the connection and returns. what names the
// listener in log lines.
func Loop(ln net.Listener, log *slog.Logger, what string, take func(net.Conn) bool) {
	backoff := minBackoff
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Keep the process and the connections already served alive, and retry.
			log.Warn(what+": accept failed", "addr", ln.Addr().String(), "err", err)
			time.Sleep(backoff)
			backoff = min(2*backoff, maxBackoff)
			continue
		}
		backoff = minBackoff
		if !take(c) {
			c.Close()
			return
		}
	}
}
