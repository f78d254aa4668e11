//go:build !linux

package endpoint

import "net"

// OtherUser is Linux-only (SO_PEERCRED); elsewhere the socket directory's mode alone keeps other
// users out.
func OtherUser(net.Conn) (uid int, other bool) { return 0, false }

// Peer names who is at the other end of c for a log line: its remote address.
func Peer(c net.Conn) string { return c.RemoteAddr().String() }
