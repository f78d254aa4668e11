//go:build !linux

package sockopt

import (
	"net"
	"time"
)

// UserTimeout is Linux-only; elsewhere keepalive alone notices a vanished host.
func UserTimeout(*net.TCPConn, time.Duration) {}
