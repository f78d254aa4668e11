package auth

import (
	"bytes"
	"crypto/rand"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/jobenv"
	"github.com/kolo-dl/kolo/testbed/authtest"
)

func pair(t *testing.T, dialSecret, listenSecret []byte) (dialErr, listenErr error) {
	t.Helper()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	done := make(chan error, 1)
	go func() { done <- Handshake(b, listenSecret, Listener, 2*time.Second) }()
	dialErr = Handshake(a, dialSecret, Dialer, 2*time.Second)
	if dialErr != nil {
		a.Close()
	}
	listenErr = <-done
	return
}

func TestHandshake(t *testing.T) {
	tests := []struct {
		name         string
		dial, listen string
		wantOK       bool
	}{
		{"same secret", "s3cret", "s3cret", true},
		{"different secret", "s3cret", "other", false},
		{"prefix secret", "s3cre", "s3cret", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			de, le := pair(t, []byte(tc.dial), []byte(tc.listen))
			if tc.wantOK && (de != nil || le != nil) {
				t.Fatalf("want success, got dialer %v, listener %v", de, le)
			}
			if !tc.wantOK && de == nil && le == nil {
				t.Fatal("handshake with wrong secret succeeded on both ends")
			}
			if !tc.wantOK && le != nil && !errors.Is(le, ErrDenied) && !strings.Contains(le.Error(), "proof") {
				t.Errorf("listener error %v does not say the peer was denied", le)
			}
		})
	}
}

func TestRejectsGarbageAndSilence(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	go func() {
		junk := make([]byte, 200)
		rand.Read(junk)
		b.Write(junk)
		buf := make([]byte, 512)
		b.Read(buf)
	}()
	if err := Handshake(a, []byte("x"), Listener, time.Second); !errors.Is(err, ErrDenied) {
		t.Errorf("random bytes: got %v, want ErrDenied", err)
	}

	c, d := net.Pipe()
	defer c.Close()
	defer d.Close()
	start := time.Now()
	if err := Handshake(c, []byte("x"), Listener, 100*time.Millisecond); err == nil {
		t.Error("silent peer passed")
	}
	if time.Since(start) > 2*time.Second {
		t.Error("handshake ignored its timeout")
	}
}

func TestReflectionRejected(t *testing.T) {
	// A peer that mirrors everything we send must not pass: roles differ.
	a, b := net.Pipe()
	defer a.Close()
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := b.Read(buf)
			if err != nil {
				return
			}
			b.Write(buf[:n])
		}
	}()
	if err := Handshake(a, []byte("x"), Dialer, time.Second); err == nil {
		t.Error("reflected handshake accepted")
	}
}

func FuzzHandshakeListener(f *testing.F) {
	f.Add([]byte(magic + strings.Repeat("n", nonceLen) + strings.Repeat("p", 32)))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		a, b := net.Pipe()
		defer a.Close()
		go func() {
			b.Write(data)
			buf := make([]byte, 512)
			for {
				if _, err := b.Read(buf); err != nil {
					return
				}
			}
		}()
		if err := Handshake(a, []byte("fuzz-secret"), Listener, 200*time.Millisecond); err == nil {
			t.Fatalf("bytes %x authenticated without the secret", data)
		}
		b.Close()
	})
}

func TestJobSecret(t *testing.T) {
	// Each source holds a different secret, strong enough to pass CheckStrength.
	s1, h1 := strings.Repeat("51", 16), "aDFoMWgxaDFoMWgxaDFoMWgx"
	fromFlag, fromEnvFile := strings.Repeat("f1", 16), strings.Repeat("e1", 16)
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	flagFile := write("flag", fromFlag+"\n")
	envFile := write("env", "  "+fromEnvFile+" \n")
	blank := write("blank", " \n\t\n")
	missing := filepath.Join(dir, "missing")
	tests := []struct {
		name    string
		file    string
		env     map[string]string
		want    string // "" with wantErr "": no secret
		wantErr string
	}{
		{"nothing", "", nil, "", ""},
		{"KOLO_SECRET", "", map[string]string{jobenv.Secret: " " + s1 + " \n"}, s1, ""},
		{"HOROVOD_SECRET_KEY", "", map[string]string{jobenv.HorovodSecret: h1}, h1, ""},
		{"KOLO_SECRET_FILE", "", map[string]string{jobenv.SecretFile: envFile}, fromEnvFile, ""},
		{"flag", flagFile, nil, fromFlag, ""},
		{"flag beats every variable", flagFile, map[string]string{jobenv.Secret: s1, jobenv.SecretFile: envFile, jobenv.HorovodSecret: h1}, fromFlag, ""},
		{"KOLO_SECRET beats KOLO_SECRET_FILE (kolo run's workers inherit the user's)", "", map[string]string{jobenv.Secret: s1, jobenv.SecretFile: envFile}, s1, ""},
		{"KOLO_SECRET beats HOROVOD_SECRET_KEY", "", map[string]string{jobenv.Secret: s1, jobenv.HorovodSecret: h1}, s1, ""},
		{"KOLO_SECRET_FILE beats HOROVOD_SECRET_KEY", "", map[string]string{jobenv.SecretFile: envFile, jobenv.HorovodSecret: h1}, fromEnvFile, ""},
		{"blank variables are not given", "", map[string]string{jobenv.Secret: "  ", jobenv.SecretFile: " ", jobenv.HorovodSecret: h1}, h1, ""},
		{"unreadable flag file does not fall through", missing, map[string]string{jobenv.Secret: s1}, "", "--secret-file: read secret file: open " + missing},
		{"blank flag file", blank, nil, "", "is empty"},
		{"a weak KOLO_SECRET is refused, naming it", "", map[string]string{jobenv.Secret: "hunter2"}, "", jobenv.Secret + ": job secret too short: 7 characters carry at most 42 bits"},
		{"a weak secret file is refused, naming it", write("weak", "0123456789abcdef\n"), nil, "", "--secret-file " + filepath.Join(dir, "weak") + ": job secret too short"},
		{"a weak HOROVOD_SECRET_KEY does not fall through to nothing", "", map[string]string{jobenv.HorovodSecret: "password"}, "", "kolo secret"},
		{"unreadable KOLO_SECRET_FILE does not fall through", "", map[string]string{jobenv.SecretFile: missing, jobenv.HorovodSecret: h1}, "", jobenv.SecretFile + ": read secret file: open " + missing},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := JobSecret(tc.file, tc.env)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				if got != nil {
					t.Errorf("secret %q returned with an error", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.want { // each source holds a different secret
				t.Errorf("JobSecret = %q, want %q", got, tc.want)
			}
			if tc.want == "" && got != nil {
				t.Errorf("no source, but secret %q", got)
			}
		})
	}
}

func TestGreetingIsAuthtests(t *testing.T) {
	if magic != authtest.Magic {
		t.Fatalf("authtest.Magic %q is not auth's greeting %q", authtest.Magic, magic)
	}
}

// A stranger that connects learns nothing it could test guesses of the secret against: the
// listener answers a wrong proof with its one-byte refusal, and silence with nothing at all.
func TestStrangerGetsNoProof(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	errs := make(chan error, 2)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				errs <- Handshake(c, []byte("the-job-secret-0123456789abcdef"), Listener, 300*time.Millisecond)
				c.Close()
			}()
		}
	}()
	for _, prove := range []bool{true, false} {
		after, err := authtest.Stranger(ln.Addr().String(), prove, 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		want := []byte{verdictDeny}
		if !prove {
			want = nil
		}
		if !bytes.Equal(after, want) {
			t.Errorf("stranger (proof sent: %v) got %x after the greeting, want %x", prove, after, want)
		}
		if err := <-errs; err == nil {
			t.Errorf("stranger (proof sent: %v) authenticated", prove)
		}
	}
}

// A dialer with the wrong secret is told at once: it sees ErrDenied, not EOF or a timeout.
func TestWrongSecretDialerIsDenied(t *testing.T) {
	de, le := pair(t, []byte("wrong"), []byte("right"))
	if !errors.Is(de, ErrDenied) || !strings.Contains(de.Error(), "refused our proof") {
		t.Errorf("dialer: %v, want ErrDenied saying the listener refused its proof", de)
	}
	if !errors.Is(le, ErrDenied) {
		t.Errorf("listener: %v, want ErrDenied", le)
	}
}

func TestCheckStrength(t *testing.T) {
	for _, tc := range []struct {
		secret string
		ok     bool
	}{
		{strings.Repeat("0f", 16), true},          // 128 bits of hex
		{strings.Repeat("0f", 15) + "0", false},   // 124
		{"YWJjZGVmZ2hpamtsbW5vcA==", true},        // 16 bytes of base64
		{"YWJjZGVmZ2hpamtsbW5v", false},           // 120 bits
		{"a correct horse battery staple", false}, // not hex or base64
		{"", false},
	} {
		err := CheckStrength([]byte(tc.secret))
		if (err == nil) != tc.ok {
			t.Errorf("CheckStrength(%q) = %v, want ok %v", tc.secret, err, tc.ok)
		}
		if err != nil && (!errors.Is(err, ErrWeakSecret) || strings.Contains(err.Error(), tc.secret) && tc.secret != "") {
			t.Errorf("CheckStrength(%q): %v: want ErrWeakSecret, without the secret in it", tc.secret, err)
		}
	}
	s, err := NewSecret()
	if err != nil || CheckStrength([]byte(s)) != nil {
		t.Errorf("NewSecret %q fails CheckStrength: %v", s, err)
	}
}
