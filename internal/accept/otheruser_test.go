package accept

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/endpoint"
	"github.com/kolo-dl/kolo/testbed/proctest"
)

const dialAsEnv = "KOLO_TEST_DIAL_AS_OTHER_USER"

// nobody is the user id the test's stranger runs as.
const nobody = 65534

// A Unix socket's peer of another user is refused at accept, before it is sent or read a byte: it
// finds its connection closed, the listener's owner never gets it, and the Gate logs it. (A job's
// socket directory keeps other users from connecting at all; this is the door behind it.)
func TestGateRefusesOtherUsers(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, to run a process as another user")
	}
	// The stranger must reach the socket and run a copy of this test binary: the directory is
	// opened to every user here, unlike a job's.
	dir := t.TempDir()
	for _, d := range []string{dir, filepath.Dir(dir)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	exe := filepath.Join(dir, "stranger.test")
	self, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(exe, self, 0o755); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "s.sock")
	ln, err := endpoint.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if err := os.Chmod(sock, 0o777); err != nil {
		t.Fatal(err)
	}
	var log proctest.Buffer
	wl := NewGate("test", slog.New(slog.NewTextHandler(&log, nil)), GatePolicy{}).Wrap(ln)
	got := make(chan net.Conn, 4)
	go func() {
		defer close(got)
		for {
			c, err := wl.Accept()
			if err != nil {
				return
			}
			got <- c
		}
	}()

	cmd := exec.Command(exe, "-test.run=^TestGateOtherUserHelper$")
	cmd.Env = append(os.Environ(), dialAsEnv+"="+sock)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("stranger as uid %d: %v\n%s", nobody, err, out)
	}
	// EOF, or a reset if its greeting reached the socket before the close did.
	if o := string(out); !strings.Contains(o, "stranger read 0 bytes: EOF") && !strings.Contains(o, "stranger read 0 bytes: read unix") {
		t.Errorf("stranger as uid %d: %s; want its connection closed unread, with no byte sent", nobody, out)
	}
	select {
	case c := <-got:
		c.Close()
		t.Fatal("the connection of another user was handed to the listener's owner")
	case <-time.After(200 * time.Millisecond):
	}
	if l := log.String(); !strings.Contains(l, "another user") || !strings.Contains(l, fmt.Sprintf("uid=%d", nobody)) || !strings.Contains(l, `remote="pid `) {
		t.Errorf("log %q does not name the refused user and process", l)
	}

	// This user's connection goes through.
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	select {
	case s := <-got:
		s.Close()
	case <-time.After(5 * time.Second):
		t.Fatal("this user's connection was not handed over")
	}
}

// TestGateOtherUserHelper is the stranger of TestGateRefusesOtherUsers, run as another user: it
// greets the socket as a kolo dialer and says what came back.
func TestGateOtherUserHelper(t *testing.T) {
	sock := os.Getenv(dialAsEnv)
	if sock == "" {
		t.Skip("run by TestGateRefusesOtherUsers")
	}
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	c.Write([]byte("KOLO2\x00 a stranger's greeting"))
	b, err := io.ReadAll(c)
	if err == nil {
		err = io.EOF
	}
	fmt.Printf("stranger read %d bytes: %v\n", len(b), err)
}
