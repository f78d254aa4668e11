//go:build !linux

package tcp

import (
	"net"
	"time"
)

// setUserTimeout is Linux-only; elsewhere keepalive alone detects a vanished host.
func setUserTimeout(*net.TCPConn, time.Duration) {}
