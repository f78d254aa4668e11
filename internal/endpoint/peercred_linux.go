package endpoint

import (
	"fmt"
	"net"
	"os"
	"syscall"
)

// OtherUser reports whether c, a connection to a Unix socket, comes from a process of another
// user than this one's (or of a user the kernel would not tell), and that user's id (-1 when
// unknown): the kernel recorded it when the process connected (SO_PEERCRED), so asking costs one
// system call and no byte of c. A TCP connection is never from another user: nothing says whose
// it is.
func OtherUser(c net.Conn) (uid int, other bool) {
	if _, ok := c.(*net.UnixConn); !ok {
		return 0, false
	}
	cred, ok := peerCred(c)
	if !ok {
		return -1, true
	}
	return int(cred.Uid), int(cred.Uid) != os.Geteuid()
}

// Peer names who is at the other end of c for a log line: a Unix socket's peer has no address,
// so its process and user id (SO_PEERCRED); else the remote address.
func Peer(c net.Conn) string {
	if _, ok := c.(*net.UnixConn); !ok {
		return c.RemoteAddr().String()
	}
	cred, ok := peerCred(c)
	if !ok {
		return "a local process (unknown)"
	}
	return fmt.Sprintf("pid %d (uid %d)", cred.Pid, cred.Uid)
}

func peerCred(c net.Conn) (*syscall.Ucred, bool) {
	raw, err := c.(*net.UnixConn).SyscallConn()
	if err != nil {
		return nil, false
	}
	var cred *syscall.Ucred
	var serr error
	if err := raw.Control(func(fd uintptr) {
		cred, serr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil || serr != nil {
		return nil, false
	}
	return cred, true
}
