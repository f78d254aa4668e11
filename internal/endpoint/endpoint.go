// Package endpoint says where a kolo listener listens and how its peers dial it: TCP at HOST:PORT
// for a job that spans hosts, or a Unix socket for a job whose ranks all run on one host. The
// sockets of such a job lie in a directory only its user may enter (Dir), so that another user's
// process cannot even connect, and a listener learns the user of each peer from the kernel
// (PeerUID) before reading a byte. An address that begins with "/" is a socket's path; anything
// else is HOST:PORT. This package must not know what is spoken over the connections.
package endpoint

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// IsUnix reports whether addr is a Unix socket's path rather than HOST:PORT.
func IsUnix(addr string) bool { return strings.HasPrefix(addr, "/") }

func network(addr string) string {
	if IsUnix(addr) {
		return "unix"
	}
	return "tcp"
}

// Listen listens at addr: a socket at that path (removed when the listener closes), or TCP.
func Listen(addr string) (net.Listener, error) {
	ln, err := net.Listen(network(addr), addr)
	if err != nil {
		return nil, err
	}
	return ln, nil
}

// Dial connects to addr, a socket's path or HOST:PORT. Every kolo dialer goes through it.
func Dial(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, network(addr), addr)
}

// String is the address a listener's peers dial: a socket's path, or HOST:PORT.
func String(a net.Addr) string {
	if u, ok := a.(*net.UnixAddr); ok {
		return u.Name
	}
	return a.String()
}

// maxPath bounds a socket's path: sun_path holds 108 bytes with its terminating NUL; Dir leaves
// room for the longest name kolo gives a socket in it.
const maxPath = 107

// maxName is the longest socket name kolo puts in a Dir (a rank's: "r" + rank + "-" + 8 hex +
// ".sock", for ranks up to 8 digits).
const maxName = 24

// Dir makes the private directory of a one-host job's sockets, mode 0700 and so closed to every
// other user: a new directory under os.TempDir(), or under /tmp when that path would leave no
// room for a socket's name. Whoever makes it removes it (os.RemoveAll) when the job ends. claim,
// if not nil, is told each path before the directory is made there: whoever must remove it should
// the maker be killed (kolo run's orphan guard) then knows it before there is anything to leak.
func Dir(claim func(dir string)) (string, error) {
	base := os.TempDir()
	if !filepath.IsAbs(base) || len(base)+len("/kolo-1234567890/")+maxName > maxPath || strings.ContainsAny(base, "|\n") {
		base = "/tmp"
	}
	for range 100 {
		dir := filepath.Join(base, "kolo-"+strconv.FormatUint(uint64(rand.Uint32()), 10))
		if claim != nil {
			claim(dir)
		}
		err := os.Mkdir(dir, 0o700)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		if err != nil {
			return "", fmt.Errorf("make the job's socket directory: %w", err)
		}
		// Mkdir's mode passes through the umask; say 0700 whatever it is.
		if err := os.Chmod(dir, 0o700); err != nil {
			os.Remove(dir)
			return "", fmt.Errorf("make the job's socket directory: %w", err)
		}
		return dir, nil
	}
	return "", fmt.Errorf("make the job's socket directory: 100 names taken in %s", base)
}
