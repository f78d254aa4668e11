package tcp

import "github.com/kolo-dl/kolo/internal/sockopt"

// tcpUserTimeout is TCP_USER_TIMEOUT, for the tests that read it back.
const tcpUserTimeout = sockopt.TCPUserTimeout
