// Package auth proves, on every connection kolo accepts or makes, that both ends know the job's
// secret, without the secret crossing the wire.
//
// The handshake is mutual HMAC-SHA256 challenge-response: each side sends a fresh random nonce;
// the dialer answers first with HMAC(secret, label || role || its own nonce || the peer's nonce),
// and the listener answers the same way only once the dialer's answer checked out. Roles differ
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

	"github.com/kolo-dl/kolo/internal/jobenv"
)

// ErrDenied means the peer did not prove knowledge of the secret (or sent garbage).
var ErrDenied = errors.New("authentication failed: peer does not know the job secret")

const (
	magic    = "KOLO2\x00"
	nonceLen = 32
	label    = "kolo auth v2"
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
// returns nil and no error. A secret found is checked by CheckStrength: a weak one is an error
// naming its source.
func JobSecret(file string, env map[string]string) ([]byte, error) {
	b, from, err := findSecret(file, env)
	if err != nil || b == nil {
		return nil, err
	}
	if err := CheckStrength(b); err != nil {
		return nil, fmt.Errorf("%s: %w", from, err)
	}
	return b, nil
}

func findSecret(file string, env map[string]string) (secret []byte, from string, err error) {
	readFile := func(from, path string) ([]byte, string, error) {
		b, err := ReadSecretFile(path) // its errors name the path
		if err != nil {
			return nil, from, fmt.Errorf("%s: %w", from, err)
		}
		return b, from + " " + path, nil
	}
	if file != "" {
		return readFile("--secret-file", file)
	}
	if v := strings.TrimSpace(env[jobenv.Secret]); v != "" {
		return []byte(v), jobenv.Secret, nil
	}
	if path := strings.TrimSpace(env[jobenv.SecretFile]); path != "" {
		return readFile(jobenv.SecretFile, path)
	}
	if v := strings.TrimSpace(env[jobenv.HorovodSecret]); v != "" {
		return []byte(v), jobenv.HorovodSecret, nil
	}
	return nil, "", nil
}

// MinSecretBits is the least a job secret must carry: a secret an attacker who was dialed (see
// Handshake) could guess offline must not be guessable.
const MinSecretBits = 128

// ErrWeakSecret is matched (errors.Is) by CheckStrength's refusals.
var ErrWeakSecret = errors.New("job secret too short")

// CheckStrength refuses a secret that is not hex or base64 of at least MinSecretBits: a word
// or a phrase, however long, is not random, and a short random string is guessable.
func CheckStrength(secret []byte) error {
	s := string(secret)
	bits := 0
	switch {
	case isDigits(s, "0123456789abcdefABCDEF"):
		bits = 4 * len(s)
	case isDigits(strings.TrimRight(s, "="), "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/-_"):
		bits = 6 * len(strings.TrimRight(s, "="))
	default:
		return fmt.Errorf("%w: it is neither hex nor base64 (a random secret of at least %d bits is; make one with `kolo secret`)", ErrWeakSecret, MinSecretBits)
	}
	if bits < MinSecretBits {
		return fmt.Errorf("%w: %d characters carry at most %d bits, and a job secret needs %d (make one with `kolo secret`: 256 random bits in hex)", ErrWeakSecret, len(s), bits, MinSecretBits)
	}
	return nil
}

func isDigits(s, alphabet string) bool {
	for _, r := range s {
		if !strings.ContainsRune(alphabet, r) {
			return false
		}
	}
	return s != ""
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

// The listener's verdict on the dialer's proof, sent before its own proof.
const (
	verdictAccept byte = 'A'
	verdictDeny   byte = 'N'
)

// Handshake runs the challenge-response on conn and returns nil only if the peer proved it knows
// secret. It sets and then clears a deadline of timeout on conn. On failure the caller must close
// conn; the error wraps ErrDenied when the peer answered wrongly (or refused our proof), or says
// what I/O failed.
//
// The dialer proves first. The listener checks that proof before it sends anything computed
// from the secret, so a stranger who connects to a kolo port learns nothing it could test
// guesses of the secret against offline: it gets a random nonce and a refusal. The dialer chose
// the address it connects to (from the launcher or the rendezvous), so it is the side that may
// reveal a proof first.
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
	// Both greetings cross at once: the write runs beside the read so that the handshake also
	// works on unbuffered conns (net.Pipe).
	sent := writeAsync(conn, append([]byte(magic), mine...))
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
	if role == Dialer {
		return dialerProves(conn, secret, mine, theirs)
	}
	return listenerChecks(conn, secret, mine, theirs)
}

// dialerProves sends the dialer's proof, then checks the listener's verdict and proof.
func dialerProves(conn net.Conn, secret, mine, theirs []byte) error {
	if _, err := conn.Write(proof(secret, Dialer, mine, theirs)); err != nil {
		return fmt.Errorf("authentication: send proof: %w", err)
	}
	var verdict [1]byte
	if _, err := io.ReadFull(conn, verdict[:]); err != nil {
		return fmt.Errorf("authentication: read the peer's verdict: %w", err)
	}
	switch verdict[0] {
	case verdictAccept:
	case verdictDeny:
		return fmt.Errorf("%w (it refused our proof)", ErrDenied)
	default:
		return fmt.Errorf("%w (bad verdict %#x)", ErrDenied, verdict[0])
	}
	got := make([]byte, sha256.Size)
	if _, err := io.ReadFull(conn, got); err != nil {
		return fmt.Errorf("authentication: read proof: %w", err)
	}
	if !hmac.Equal(got, proof(secret, Listener, theirs, mine)) {
		return ErrDenied
	}
	return nil
}

// listenerChecks reads and checks the dialer's proof; only a dialer that proved it knows the
// secret gets the listener's proof. A wrong proof gets the denial: one byte that says nothing of
// the secret, so that a dialer with the wrong secret fails at once instead of retrying.
func listenerChecks(conn net.Conn, secret, mine, theirs []byte) error {
	got := make([]byte, sha256.Size)
	if _, err := io.ReadFull(conn, got); err != nil {
		return fmt.Errorf("authentication: read proof: %w", err)
	}
	if !hmac.Equal(got, proof(secret, Dialer, theirs, mine)) {
		conn.Write([]byte{verdictDeny})
		return ErrDenied
	}
	reply := append([]byte{verdictAccept}, proof(secret, Listener, mine, theirs)...)
	if _, err := conn.Write(reply); err != nil {
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
