// Package auth proves, on every connection kolo accepts or makes, that both ends know the job's
// secret, without the secret crossing the wire.
//
// The handshake is mutual HMAC-SHA256 challenge-response: each side sends a fresh random nonce, then
// each answers with HMAC(secret, label || role || its own nonce || the peer's nonce). Roles differ
// so that a reflected answer is rejected. It must stay cheap (one round trip) and must never log,
// print or return the secret.
package auth

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"
)

// SecretEnv is the environment variable through which the launcher hands the job secret to workers.
const SecretEnv = "KOLO_SECRET"

// ErrDenied means the peer did not prove knowledge of the secret (or sent garbage).
var ErrDenied = errors.New("authentication failed: peer does not know the job secret")

const (
	magic    = "KOLO1\x00"
	nonceLen = 32
	label    = "kolo auth v1"
)

// Role distinguishes the two ends so that a peer cannot pass by echoing our own proof.
type Role byte

const (
	Dialer   Role = 'D'
	Listener Role = 'L'
)

// NewSecret returns a fresh random job secret, hex encoded so it survives environments and files.
func NewSecret() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generate job secret: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// SecretFromEnv reads the job secret from KOLO_SECRET (or HOROVOD_SECRET_KEY for scripts launched by
// tools that set it). ok is false when neither is set.
func SecretFromEnv() (secret []byte, ok bool) {
	for _, k := range []string{SecretEnv, "HOROVOD_SECRET_KEY"} {
		if v := strings.TrimSpace(os.Getenv(k)); v != "" {
			return []byte(v), true
		}
	}
	return nil, false
}

// ReadSecretFile reads a secret from a file (trailing whitespace ignored) and refuses an empty one.
func ReadSecretFile(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read secret file: %w", err)
	}
	b = bytes.TrimSpace(b)
	if len(b) == 0 {
		return nil, fmt.Errorf("secret file %s is empty", path)
	}
	return b, nil
}

func proof(secret []byte, role Role, mine, theirs []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(label))
	m.Write([]byte{byte(role)})
	m.Write(mine)
	m.Write(theirs)
	return m.Sum(nil)
}

// Handshake runs the mutual challenge-response on conn and returns nil only if the peer proved it
// knows secret. It sets and then clears a deadline of timeout on conn. On failure the caller must
// close conn; the error wraps ErrDenied when the peer answered wrongly, or says what I/O failed.
func Handshake(conn net.Conn, secret []byte, role Role, timeout time.Duration) error {
	if len(secret) == 0 {
		return errors.New("authentication: empty job secret")
	}
	if err := conn.SetDeadline(time.Now().Add(timeout)); err != nil {
		return fmt.Errorf("authentication: set deadline: %w", err)
	}
	defer conn.SetDeadline(time.Time{})

	mine := make([]byte, nonceLen)
	if _, err := rand.Read(mine); err != nil {
		return fmt.Errorf("authentication: nonce: %w", err)
	}
	// Writes run beside reads so that the handshake also works on unbuffered conns (net.Pipe).
	hello := append([]byte(magic), mine...)
	sent := writeAsync(conn, hello)
	peerHello := make([]byte, len(magic)+nonceLen)
	if _, err := io.ReadFull(conn, peerHello); err != nil {
		return fmt.Errorf("authentication: read challenge: %w", err)
	}
	if string(peerHello[:len(magic)]) != magic {
		return fmt.Errorf("%w (not a kolo peer: bad greeting)", ErrDenied)
	}
	theirs := peerHello[len(magic):]
	if bytes.Equal(theirs, mine) {
		return fmt.Errorf("%w (peer echoed our challenge)", ErrDenied)
	}
	if err := <-sent; err != nil {
		return fmt.Errorf("authentication: send challenge: %w", err)
	}

	peerRole := Listener
	if role == Listener {
		peerRole = Dialer
	}
	sent = writeAsync(conn, proof(secret, role, mine, theirs))
	got := make([]byte, sha256.Size)
	if _, err := io.ReadFull(conn, got); err != nil {
		return fmt.Errorf("authentication: read proof: %w", err)
	}
	if !hmac.Equal(got, proof(secret, peerRole, theirs, mine)) {
		// Let our proof reach the peer before the caller closes the conn, so that a peer with the
		// wrong secret learns it was denied (its check of our proof fails) rather than seeing EOF.
		<-sent
		return ErrDenied
	}
	if err := <-sent; err != nil {
		return fmt.Errorf("authentication: send proof: %w", err)
	}
	return nil
}

func writeAsync(conn net.Conn, b []byte) <-chan error {
	ch := make(chan error, 1)
	go func() {
		_, err := conn.Write(b)
		ch <- err
	}()
	return ch
}
