// Package authtest plays a stranger at a kolo listener, for tests that check that a listener
// reveals nothing computed from the job secret to a peer that has not proved it knows it.
//
// It is test support: production code must not import it.
package authtest

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/endpoint"
)

// Magic is the greeting auth.Handshake sends first (auth's own tests check that the two agree).
const Magic = "KOLO2\x00"

const nonceLen, proofLen = 32, 32

// Stranger connects to addr (HOST:PORT or a Unix socket's path) as a kolo dialer that does not know the secret: it greets, then, if
// prove, sends a proof made with some other secret. It returns every byte the listener sent after
// its greeting, until the listener closed the connection or timeout passed.
func Stranger(addr string, prove bool, timeout time.Duration) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	c, err := endpoint.Dial(ctx, addr)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	hello := make([]byte, len(Magic)+nonceLen)
	copy(hello, Magic)
	rand.Read(hello[len(Magic):])
	msg := hello
	if prove {
		guess := make([]byte, proofLen)
		rand.Read(guess)
		msg = append(msg, guess...)
	}
	if _, err := c.Write(msg); err != nil {
		return nil, fmt.Errorf("stranger: send: %w", err)
	}
	theirs := make([]byte, len(hello))
	if _, err := io.ReadFull(c, theirs); err != nil {
		return nil, fmt.Errorf("stranger: read the listener's greeting: %w", err)
	}
	if string(theirs[:len(Magic)]) != Magic {
		return nil, fmt.Errorf("stranger: the listener greeted with %q, not kolo's greeting", theirs[:len(Magic)])
	}
	after, _ := io.ReadAll(c) // until it hangs up, or the deadline
	return after, nil
}

// RevealsNothing fails t unless the listener at addr answers a stranger's wrong proof with at
// most its one-byte refusal, and a silent stranger with nothing, after its greeting.
func RevealsNothing(t testing.TB, addr string) {
	t.Helper()
	for _, tc := range []struct {
		prove   bool
		timeout time.Duration
		max     int
	}{{true, 5 * time.Second, 1}, {false, 300 * time.Millisecond, 0}} {
		after, err := Stranger(addr, tc.prove, tc.timeout)
		if err != nil {
			t.Fatal(err)
		}
		if len(after) > tc.max {
			t.Errorf("stranger at %s (proof sent: %v) got %d bytes after the greeting (%x), want at most %d",
				addr, tc.prove, len(after), after, tc.max)
		}
	}
}
