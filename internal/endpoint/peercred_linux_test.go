package endpoint

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A Unix socket's peer has no address; Peer names its process and user (SO_PEERCRED), and a TCP
// peer by its address. OtherUser finds this process's own connection not another user's.
func TestPeer(t *testing.T) {
	for _, addr := range []string{"127.0.0.1:0", filepath.Join(t.TempDir(), "s.sock")} {
		t.Run(addr, func(t *testing.T) {
			c, d, _ := connected(t, addr)
			want := d.LocalAddr().String()
			if IsUnix(addr) {
				want = fmt.Sprintf("pid %d (uid %d)", os.Getpid(), os.Geteuid())
			}
			if got := Peer(c); got != want || strings.Contains(got, "@") {
				t.Errorf("Peer = %q, want %q", got, want)
			}
			if uid, other := OtherUser(c); other {
				t.Errorf("OtherUser = %d, true for this process's own connection", uid)
			}
		})
	}
}
