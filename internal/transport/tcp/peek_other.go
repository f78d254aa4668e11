//go:build !unix

package tcp

import (
	"errors"
	"net"
)

// peekable says that peekNow works here.
const peekable = false

// peekNow is not available here: a set still arriving is not watched.
func peekNow(conn, []byte) (int, error) {
	return 0, errors.New("peeking at a socket is not supported on this platform")
}
