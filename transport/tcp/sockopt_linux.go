package tcp

import (
	"net"
	"syscall"
	"time"
)

// tcpUserTimeout is TCP_USER_TIMEOUT from linux/tcp.h (syscall does not name it).
const tcpUserTimeout = 0x12

// setUserTimeout bounds how long sent data may stay unacknowledged before the kernel drops the
// connection, so that a peer whose host vanished (no RST ever comes) fails a blocked Send.
func setUserTimeout(c *net.TCPConn, d time.Duration) {
	raw, err := c.SyscallConn()
	if err != nil {
		return
	}
	raw.Control(func(fd uintptr) {
		syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, tcpUserTimeout, int(d/time.Millisecond))
	})
}
