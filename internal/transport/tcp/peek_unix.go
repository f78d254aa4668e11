//go:build unix

package tcp

import (
	"io"
	"syscall"
)

// peekable says that peekNow works here.
const peekable = true

// peekNow copies what has arrived on c into buf without consuming it, and without waiting: (0,
// nil) when nothing has arrived yet, io.EOF once the peer closed. It holds the socket's read lock
// only for the call, so a reader that takes the connection meanwhile is not held up.
func peekNow(c conn, buf []byte) (int, error) {
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
				return true
			}
		}
	})
	switch {
	case err != nil:
		return 0, err
	case serr == syscall.EAGAIN:
		return 0, nil
	case serr != nil:
		return 0, serr
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}
