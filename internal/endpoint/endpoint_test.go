package endpoint

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestIsUnix(t *testing.T) {
	for _, tc := range []struct {
		addr string
		want bool
	}{
		{"/run/user/1000/kolo-1/rendezvous.sock", true},
		{"127.0.0.1:4000", false},
		{"[::1]:4000", false},
		{"myhost:4000", false},
		{"", false},
	} {
		if got := IsUnix(tc.addr); got != tc.want {
			t.Errorf("IsUnix(%q) = %v, want %v", tc.addr, got, tc.want)
		}
	}
}

// connected listens at addr and dials it: the connection as accepted, and as dialed. Both close
// with the test.
func connected(t *testing.T, addr string) (accepted, dialed net.Conn, ln net.Listener) {
	t.Helper()
	ln, err := Listen(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	got := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(got)
			return
		}
		got <- c
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	dialed, err = Dial(ctx, ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dialed.Close() })
	accepted, ok := <-got
	if !ok {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { accepted.Close() })
	return accepted, dialed, ln
}

// Dial reaches what Listen opened, whichever kind of address, and a Unix socket's file goes with
// its listener.
func TestListenDial(t *testing.T) {
	for _, addr := range []string{"127.0.0.1:0", filepath.Join(t.TempDir(), "s.sock")} {
		t.Run(addr, func(t *testing.T) {
			a, d, ln := connected(t, addr)
			a.Write([]byte("hi"))
			a.Close()
			b, err := io.ReadAll(d)
			if err != nil || string(b) != "hi" {
				t.Errorf("read %q, %v; want \"hi\"", b, err)
			}
			ln.Close()
			if IsUnix(addr) {
				if _, err := os.Stat(addr); !os.IsNotExist(err) {
					t.Errorf("socket file left after its listener closed (stat: %v)", err)
				}
			}
		})
	}
}

// Dir is a new directory only this user may enter, in the temp directory, or in /tmp when that
// would leave a socket's path too long.
func TestDir(t *testing.T) {
	long := filepath.Join(t.TempDir(), strings.Repeat("d", maxPath))
	if err := os.MkdirAll(long, 0o700); err != nil {
		t.Skipf("cannot make a directory with a long name here: %v", err)
	}
	for _, tc := range []struct {
		name, tmpdir, wantIn string
	}{
		{"temp dir", t.TempDir(), ""},
		{"too long", long, "/tmp"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("TMPDIR", tc.tmpdir)
			var claimed string
			dir, err := Dir(func(d string) {
				if _, err := os.Lstat(d); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("claimed %s, which exists already (Lstat: %v): a maker killed now would leave it", d, err)
				}
				claimed = d
			})
			if err != nil {
				t.Fatal(err)
			}
			defer os.RemoveAll(dir)
			if claimed != dir {
				t.Errorf("Dir() = %s, but the last path claimed was %q", dir, claimed)
			}
			want := tc.wantIn
			if want == "" {
				want = tc.tmpdir
			}
			if filepath.Dir(dir) != want {
				t.Errorf("Dir() = %s, want one in %s", dir, want)
			}
			if len(dir)+1+maxName > maxPath {
				t.Errorf("Dir() = %s leaves no room for a socket's name", dir)
			}
			fi, err := os.Stat(dir)
			if err != nil {
				t.Fatal(err)
			}
			if !fi.IsDir() || fi.Mode().Perm() != 0o700 {
				t.Errorf("Dir() made %s with mode %v, want a directory of mode 0700", dir, fi.Mode())
			}
		})
	}
}
