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
				return serr != syscall.EAGAIN
			}
		}
	})
	switch {
	case err != nil:
		return 0, err
	case serr != nil:
		return 0, serr
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}
