package rendezvous

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/authtest"
)

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A stranger's churn of failed handshakes writes a few lines, not one per connection, and the
// job's own clients are served throughout.
func TestStrangerChurnLogsLittle(t *testing.T) {
	var log lockedBuffer
	srv := newServer(secret, slog.New(slog.NewTextHandler(&log, nil)), time.Second)
	defer srv.Close()
	addr, err := srv.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	for range 300 {
		if _, err := authtest.Stranger(addr.String(), true, 2*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := Dial(ctx, addr.String(), secret)
	if err != nil {
		t.Fatalf("the job's client after the churn: %v", err)
	}
	c.Close()
	if n := strings.Count(log.String(), "\n"); n > 10 {
		t.Errorf("300 strangers wrote %d log lines (%d bytes), want a handful:\n%.2000s", n, len(log.String()), log.String())
	}
}
