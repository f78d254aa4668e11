package rendezvous

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/testbed/authtest"
)

// A stranger's churn of failed handshakes writes a few lines, not one per connection, and the
// job's own clients are served throughout.
func TestStrangerChurnLogsLittle(t *testing.T) {
	sink := &logSink{}
	srv := newServer(secret, slog.New(sink), time.Second)
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
	sink.mu.Lock()
	n := len(sink.recs)
	sink.mu.Unlock()
	if n > 10 {
		t.Errorf("300 strangers wrote %d log lines, want a handful (%d one by one: %v)", n,
			len(sink.warnings("rendezvous: rejected connection")), sink.warnings("rendezvous: rejected connection"))
	}
}
