//go:build unix

package tcp

import (
	"io"
	"net"
	"syscall"
)

// peekable says that peek works here.
const peekable = true

// peek waits, within c's read deadline, for bytes to arrive and copies what has arrived into buf
// without consuming it.
func peek(c *net.TCPConn, buf []byte) (int, error) {
	return peekAt(c, buf, true)
}

// peekNow is peek that does not wait: (0, nil) when nothing has arrived yet. It holds the
// socket's read lock only for the call, so a reader that takes the connection meanwhile is not
// held up.
func peekNow(c *net.TCPConn, buf []byte) (int, error) {
	return peekAt(c, buf, false)
}

func peekAt(c *net.TCPConn, buf []byte, wait bool) (int, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var n int
	var serr error
	err = rc.Read(func(fd uintptr) bool {
		for {
			n, _, serr = syscall.Recvfrom(int(fd), buf, syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
			if serr != syscall.EINTR {
				// false: nothing yet, and rc.Read waits for the socket to be readable.
				return !wait || serr != syscall.EAGAIN
			}
		}
	})
	switch {
	case err != nil:
		return 0, err
	case serr == syscall.EAGAIN:
		return 0, nil // only when not waiting
	case serr != nil:
		return 0, serr
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}
