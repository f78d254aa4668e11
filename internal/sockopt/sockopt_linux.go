package sockopt

import (
	"net"
	"syscall"
	"time"
)

// UserTimeout bounds how long sent data (or, with keepalive on, an idle connection's probes) may
// stay unacknowledged before the kernel drops the connection: what notices a peer host that
// vanished or was cut off. Best effort.
func UserTimeout(c *net.TCPConn, d time.Duration) {
	raw, err := c.SyscallConn()
	if err != nil {
		return
	}
	raw.Control(func(fd uintptr) {
		syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, TCPUserTimeout, int(d/time.Millisecond))
	})
}
