package endpoint

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A Unix socket's peer has no address; Peer names its process and user (SO_PEERCRED), and a TCP
// peer by its address. OtherUser finds this process's own connection not another user's.
func TestPeer(t *testing.T) {
	for _, addr := range []string{"127.0.0.1:0", filepath.Join(t.TempDir(), "s.sock")} {
		t.Run(addr, func(t *testing.T) {
			ln, err := Listen(addr)
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			accepted := make(chan net.Conn, 1)
			go func() {
				c, err := ln.Accept()
				if err != nil {
					close(accepted)
					return
				}
				accepted <- c
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			d, err := Dial(ctx, ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			c, ok := <-accepted
			if !ok {
				t.Fatal("accept failed")
			}
			defer c.Close()
			want := d.LocalAddr().String()
			if IsUnix(addr) {
				want = fmt.Sprintf("pid %d (uid %d)", os.Getpid(), os.Geteuid())
			}
			if got := Peer(c); got != want {
				t.Errorf("Peer = %q, want %q", got, want)
			}
			if strings.Contains(Peer(c), "@") {
				t.Errorf("Peer = %q names no one", Peer(c))
			}
			if uid, other := OtherUser(c); other {
				t.Errorf("OtherUser = %d, true for this process's own connection", uid)
			}
		})
	}
}
