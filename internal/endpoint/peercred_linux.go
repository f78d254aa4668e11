package endpoint

import (
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
	u, ok := c.(*net.UnixConn)
	if !ok {
		return 0, false
	}
	raw, err := u.SyscallConn()
	if err != nil {
		return -1, true
	}
	var cred *syscall.Ucred
	var serr error
	if err := raw.Control(func(fd uintptr) {
		cred, serr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil || serr != nil {
		return -1, true
	}
	return int(cred.Uid), int(cred.Uid) != os.Geteuid()
}
