// Package auth proves, on every connection kolo accepts or makes, that both ends know the job's
// secret, without the secret crossing the wire.
//
// The handshake is mutual HMAC-SHA256 challenge-response: each side sends a fresh random nonce, then
// each answers with HMAC(secret, label || role || its own nonce || the peer's nonce). Roles differ
// so that a reflected answer is rejected. JobSecret is the one place that decides where a process
// finds the secret (flag, variables, files). It must stay cheap (one round trip) and must never
// log or print the secret, nor put it in an error.
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

	"github.com/kolo-dl/kolo/jobenv"
)

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

// JobSecret is the one place that decides where a process's job secret comes from; the launcher
// (kolo run --rendezvous) and the workers (package bootstrap) both ask it. The first source given
// wins:
//
//  1. file, the path given to kolo run --secret-file: the command line beats the environment;
//  2. KOLO_SECRET in env: kolo run hands its workers the secret there, so it must beat a
//     KOLO_SECRET_FILE or HOROVOD_SECRET_KEY they inherit from the user's shell;
//  3. the file named by KOLO_SECRET_FILE in env;
//  4. HOROVOD_SECRET_KEY in env (kolo's own names beat Horovod's, as everywhere).
//
// A variable that is empty or only blanks is not given. A source that is given but unusable (a file
// that cannot be read, or holds only blanks) is an error naming the source, never a reason to fall
// through to the next one: a wrong mount must not quietly pick another secret. With no source it
// returns nil and no error.
func JobSecret(file string, env map[string]string) ([]byte, error) {
	readFile := func(from, path string) ([]byte, error) {
		b, err := ReadSecretFile(path) // its errors name the path
		if err != nil {
			return nil, fmt.Errorf("%s: %w", from, err)
		}
		return b, nil
	}
	if file != "" {
		return readFile("--secret-file", file)
	}
	if v := strings.TrimSpace(env[jobenv.Secret]); v != "" {
		return []byte(v), nil
	}
	if path := strings.TrimSpace(env[jobenv.SecretFile]); path != "" {
		return readFile(jobenv.SecretFile, path)
	}
	if v := strings.TrimSpace(env[jobenv.HorovodSecret]); v != "" {
		return []byte(v), nil
	}
	return nil, nil
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
