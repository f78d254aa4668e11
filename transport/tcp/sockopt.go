package tcp

import (
	"net"
	"time"

	"github.com/kolo-dl/kolo/internal/sockopt"
)

// tcpUserTimeout is TCP_USER_TIMEOUT, for the tests that read it back.
const tcpUserTimeout = sockopt.TCPUserTimeout

// setUserTimeout bounds how long sent data may stay unacknowledged before the kernel drops the
// connection, so that a peer whose host vanished (no RST ever comes) fails a blocked Send.
func setUserTimeout(c *net.TCPConn, d time.Duration) { sockopt.UserTimeout(c, d) }
