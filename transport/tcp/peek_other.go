//go:build !unix

package tcp

import (
	"errors"
	"net"
)

// peekable says that peek works here.
const peekable = false

// peek is not available here: a set still arriving is not watched.
func peek(*net.TCPConn, []byte) (int, error) {
	return 0, errors.New("peeking at a socket is not supported on this platform")
}

func peekNow(*net.TCPConn, []byte) (int, error) {
	return 0, errors.New("peeking at a socket is not supported on this platform")
}
