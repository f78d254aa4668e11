package bootstrap

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/jobenv"
	"github.com/kolo-dl/kolo/internal/rendezvous"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// ompi is the environment mpirun gives rank r of size ranks on one host, plus extra variables.
func ompi(r, size int, dir string, extra ...string) map[string]string {
	env := map[string]string{
		"OMPI_COMM_WORLD_RANK": strconv.Itoa(r), "OMPI_COMM_WORLD_SIZE": strconv.Itoa(size),
		"OMPI_COMM_WORLD_LOCAL_RANK": strconv.Itoa(r), "OMPI_COMM_WORLD_LOCAL_SIZE": strconv.Itoa(size),
		"PMIX_NAMESPACE": "4242", jobenv.RendezvousDir: dir,
	}
	for i := 0; i+1 < len(extra); i += 2 {
		env[extra[i]] = extra[i+1]
	}
	return env
}

// joinAll runs Join for every env concurrently, rank 0 after delay0.
func joinAll(t *testing.T, envs []map[string]string, delay0, timeout time.Duration) ([]*Session, []error) {
	t.Helper()
	ss := make([]*Session, len(envs))
	errs := make([]error, len(envs))
	var wg sync.WaitGroup
	for r, env := range envs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if r == 0 {
				time.Sleep(delay0)
			}
			ss[r], errs[r] = Join(context.Background(), env, "node1", Options{Timeout: timeout, Log: quiet})
		}()
	}
	wg.Wait()
	return ss, errs
}

func TestJoinPlainAndKoloRun(t *testing.T) {
	s, err := Join(context.Background(), map[string]string{"PATH": "/bin"}, "me", Options{})
	if err != nil || s.Job != jobenv.Single("me") || s.Secret != nil || s.Launcher != jobenv.NoLauncher {
		t.Fatalf("plain process: %+v, %v", s, err)
	}
	kolo := jobenv.Encode(jobenv.Job{Rank: 1, Size: 2, LocalRank: 1, LocalSize: 2, CrossSize: 1, Hostname: "h", Rendezvous: "h:1", JobID: "j"})
	if _, err := Join(context.Background(), kolo, "me", Options{}); err == nil || !strings.Contains(err.Error(), "no job secret") {
		t.Errorf("kolo run without secret: %v", err)
	}
	secretFile := filepath.Join(t.TempDir(), "secret")
	os.WriteFile(secretFile, []byte(testSecret+"\n"), 0o600)
	kolo[jobenv.SecretFile] = secretFile
	s, err = Join(context.Background(), kolo, "me", Options{})
	if err != nil || string(s.Secret) != testSecret || s.Launcher != jobenv.KoloRun {
		t.Errorf("kolo run with secret file: %+v, %v", s, err)
	}
	kolo[jobenv.SecretFile] = filepath.Join(t.TempDir(), "missing")
	if _, err := Join(context.Background(), kolo, "me", Options{}); err == nil || !strings.Contains(err.Error(), jobenv.SecretFile) {
		t.Errorf("missing secret file: %v", err)
	}
}

// An elastic worker whose first world is itself alone still reads the job's secret: it meets the
// launcher at the rendezvous for its rounds (a job of one that grows).
func TestJoinElasticWorldOfOneReadsTheSecret(t *testing.T) {
	env := jobenv.Encode(jobenv.Job{Size: 1, LocalSize: 1, CrossSize: 1, Hostname: "h", Rendezvous: "h:1", JobID: "j"})
	env[jobenv.Secret] = testSecret
	if s, err := Join(context.Background(), env, "me", Options{}); err != nil || s.Secret != nil {
		t.Fatalf("a plain job of one: %+v, %v (needs no secret)", s, err)
	}
	env[jobenv.Elastic] = "1"
	s, err := Join(context.Background(), env, "me", Options{})
	if err != nil || string(s.Secret) != testSecret {
		t.Fatalf("an elastic worker alone: %+v, %v", s, err)
	}
}

// The ranks of an mpirun job find rank 0's rendezvous through a private file, and rank 0 removes
// it when the job ends.
func TestJoinThroughFile(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "rv")
	envs := []map[string]string{ompi(0, 3, dir), ompi(1, 3, dir), ompi(2, 3, dir)}
	ss, errs := joinAll(t, envs, 150*time.Millisecond, 20*time.Second) // others wait for rank 0
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	defer ss[0].Close()
	file := filepath.Join(dir, "mpirun-4242")
	for r, s := range ss {
		if s.Job.Rendezvous != ss[0].Job.Rendezvous || string(s.Secret) != string(ss[0].Secret) || len(s.Secret) < 32 {
			t.Errorf("rank %d: rendezvous %q secret %d bytes; rank 0 has %q", r, s.Job.Rendezvous, len(s.Secret), ss[0].Job.Rendezvous)
		}
		if s.Launcher != jobenv.MPIRun || s.Job.JobID != "mpirun-4242" {
			t.Errorf("rank %d: %q %q", r, s.Launcher, s.Job.JobID)
		}
	}
	if !strings.HasPrefix(ss[0].Job.Rendezvous, "127.0.0.1:") {
		t.Errorf("one-host job advertises %q, want loopback", ss[0].Job.Rendezvous)
	}
	fi, err := os.Stat(file)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("rendezvous file: %v, %v", fi, err)
	}
	if di, _ := os.Stat(dir); di.Mode().Perm() != 0o700 {
		t.Errorf("rendezvous dir mode %v", di.Mode().Perm())
	}
	// The server admits the secret (and only it).
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := rendezvous.Dial(ctx, ss[0].Job.Rendezvous, ss[2].Secret)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if _, err := rendezvous.Dial(ctx, ss[0].Job.Rendezvous, []byte("wrong")); err == nil {
		t.Error("rendezvous admitted a wrong secret")
	}
	if err := ss[0].Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(file); !os.IsNotExist(err) {
		t.Errorf("rank 0 left %s behind: %v", file, err)
	}
}

// A user-given secret is never written to the file; the ranks read it from their environment.
func TestJoinGivenSecretStaysOutOfFile(t *testing.T) {
	dir := t.TempDir()
	envs := []map[string]string{ompi(0, 2, dir, jobenv.Secret, givenSecret), ompi(1, 2, dir, jobenv.Secret, givenSecret)}
	ss, errs := joinAll(t, envs, 0, 20*time.Second)
	if errs[0] != nil || errs[1] != nil {
		t.Fatal(errs)
	}
	defer ss[0].Close()
	b, err := os.ReadFile(filepath.Join(dir, "mpirun-4242"))
	if err != nil || strings.Contains(string(b), "secret=") || string(ss[1].Secret) != givenSecret {
		t.Errorf("file %q (%v), rank 1 secret %q", b, err, ss[1].Secret)
	}
}

// With KOLO_RENDEZVOUS_ADDR and KOLO_SECRET given (mpirun -x), no file is written and rank 0
// listens at the given address.
func TestJoinGivenAddress(t *testing.T) {
	dir := t.TempDir()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	envs := []map[string]string{
		ompi(0, 2, dir, jobenv.Rendezvous, addr, jobenv.Secret, givenSecret),
		ompi(1, 2, dir, jobenv.Rendezvous, addr, jobenv.Secret, givenSecret),
	}
	ss, errs := joinAll(t, envs, 0, 20*time.Second)
	if errs[0] != nil || errs[1] != nil {
		t.Fatal(errs)
	}
	defer ss[0].Close()
	if ss[0].Job.Rendezvous != addr || ss[1].Job.Rendezvous != addr {
		t.Errorf("rendezvous %q / %q, want %q", ss[0].Job.Rendezvous, ss[1].Job.Rendezvous, addr)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("files written: %v", entries)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := rendezvous.Dial(ctx, addr, []byte(givenSecret))
	if err != nil {
		t.Fatalf("rank 0 does not serve at %s: %v", addr, err)
	}
	c.Close()
}

// A file left by a crashed job with the same id names a dead server: rank 1 keeps waiting and
// joins the live one once rank 0 replaces the file.
func TestJoinIgnoresStaleFile(t *testing.T) {
	dir := t.TempDir()
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := ln.Addr().String()
	ln.Close()
	stale := fmt.Sprintf("addr=%s\nnonce=old\nsecret=oldsecret\n", dead)
	if err := os.WriteFile(filepath.Join(dir, "mpirun-4242"), []byte(stale), 0o600); err != nil {
		t.Fatal(err)
	}
	ss, errs := joinAll(t, []map[string]string{ompi(0, 2, dir), ompi(1, 2, dir)}, 500*time.Millisecond, 20*time.Second)
	if errs[0] != nil || errs[1] != nil {
		t.Fatal(errs)
	}
	defer ss[0].Close()
	if ss[1].Job.Rendezvous == dead || ss[1].Job.Rendezvous != ss[0].Job.Rendezvous {
		t.Errorf("rank 1 joined %q, rank 0 hosts %q (stale %q)", ss[1].Job.Rendezvous, ss[0].Job.Rendezvous, dead)
	}
}

// A live server of another job with the same id and secret is not joined either: its nonce differs.
func TestVerifyRejectsForeignServer(t *testing.T) {
	srv := rendezvous.NewServer([]byte("s"))
	addr, err := srv.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	srv.Set(nonceKey, []byte("theirs"))
	err = verify(context.Background(), record{addr: addr.String(), nonce: "ours", secret: []byte("s")})
	if err == nil || !strings.Contains(err.Error(), "another job") {
		t.Errorf("verify = %v", err)
	}
	if err := verify(context.Background(), record{addr: addr.String(), nonce: "theirs", secret: []byte("s")}); err != nil {
		t.Errorf("verify own server: %v", err)
	}
}

// Without rank 0 a rank gives up after its timeout, saying what it waited for and how to avoid it.
func TestJoinTimeoutSaysWhatToDo(t *testing.T) {
	dir := t.TempDir()
	start := time.Now()
	_, err := Join(context.Background(), ompi(1, 2, dir), "node1", Options{Timeout: 300 * time.Millisecond, Log: quiet})
	if err == nil {
		t.Fatal("no error without rank 0")
	}
	for _, want := range []string{"rank 1 of mpirun job mpirun-4242", filepath.Join(dir, "mpirun-4242"), "does not exist yet",
		jobenv.Rendezvous, jobenv.Secret, jobenv.RendezvousDir} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	if el := time.Since(start); el > 10*time.Second {
		t.Errorf("gave up after %v", el)
	}
}

// Rank 0 removes only its own file: one written since by another run stays.
func TestCloseKeepsForeignFile(t *testing.T) {
	dir := t.TempDir()
	s, err := Join(context.Background(), ompi(0, 2, dir), "node1", Options{Log: quiet})
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "mpirun-4242")
	os.WriteFile(file, []byte("addr=x:1\nnonce=other\n"), 0o600)
	s.Close()
	if _, err := os.Stat(file); err != nil {
		t.Errorf("foreign file removed: %v", err)
	}
}

func TestListenAddr(t *testing.T) {
	var mine string // a non-loopback address of this machine, if it has one
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && !ipn.IP.IsLoopback() && ipn.IP.To4() != nil {
				mine = ipn.IP.String()
				break
			}
		}
	}
	type test struct {
		job               jobenv.Job
		iface             net.IP
		listen, advertise string
		err               string
	}
	tests := []test{
		{jobenv.Job{Size: 4, LocalSize: 4}, nil, "127.0.0.1:0", "", ""},
		{jobenv.Job{Size: 4, LocalSize: 2, Hostname: "kolo-no-such-host.invalid"}, nil, ":0", "", ""},
		{jobenv.Job{Size: 4, LocalSize: 2, Hostname: "kolo-no-such-host.invalid"}, net.IPv4(10, 9, 8, 7), "10.9.8.7:0", "", ""},
		{jobenv.Job{Size: 4, LocalSize: 2, Rendezvous: "node1:29500"}, net.IPv4(10, 9, 8, 7), "10.9.8.7:29500", "node1:29500", ""},
		{jobenv.Job{Size: 4, LocalSize: 2, Rendezvous: "10.1.2.3:29500"}, nil, ":29500", "10.1.2.3:29500", ""},
		{jobenv.Job{Size: 4, LocalSize: 2, Rendezvous: "node1:29500"}, nil, ":29500", "node1:29500", ""},
		{jobenv.Job{Size: 4, LocalSize: 4, Rendezvous: "127.0.0.1:29500"}, nil, "127.0.0.1:29500", "127.0.0.1:29500", ""},
		{jobenv.Job{Size: 4, LocalSize: 4, Rendezvous: "node1"}, nil, "", "", "fixed port"},
		{jobenv.Job{Size: 4, LocalSize: 4, Rendezvous: "node1:0"}, nil, "", "", "fixed port"},
	}
	if mine != "" { // the rendezvous address given is this machine's: listen there, whatever the interface
		addr := net.JoinHostPort(mine, "29500")
		tests = append(tests, test{jobenv.Job{Size: 4, LocalSize: 2, Rendezvous: addr}, net.IPv4(10, 9, 8, 7), addr, addr, ""})
	}
	for _, tc := range tests {
		l, a, err := listenAddr(tc.job, tc.iface)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%+v: err %v, want %q", tc.job, err, tc.err)
			}
			continue
		}
		if err != nil || l != tc.listen || a != tc.advertise {
			t.Errorf("%+v: %q %q %v; want %q %q", tc.job, l, a, err, tc.listen, tc.advertise)
		}
	}
}

func TestRendezvousDir(t *testing.T) {
	if d, _ := rendezvousDir(map[string]string{"HOME": "/home/u"}); d != "/home/u/.kolo/rendezvous" {
		t.Errorf("default dir %q", d)
	}
	if d, _ := rendezvousDir(map[string]string{"HOME": "/home/u", jobenv.RendezvousDir: "/shared/kolo"}); d != "/shared/kolo" {
		t.Errorf("KOLO_RENDEZVOUS_DIR ignored: %q", d)
	}
}

// On several hosts rank 0 advertises its host name, or the address of KOLO_NETWORK_INTERFACE, else
// of Horovod's HOROVOD_GLOO_IFACE, as every other rank reads them.
func TestJoinAdvertisesInterface(t *testing.T) {
	tests := []struct {
		name    string
		vars    []string // extra variables of every rank
		wantErr string   // of rank 0 alone, when the interface is missing
	}{
		{"KOLO_NETWORK_INTERFACE", []string{jobenv.NetworkInterface, "nosuch0,lo"}, ""},
		{"HOROVOD_GLOO_IFACE", []string{jobenv.HorovodNetworkInterface, "nosuch0,lo"}, ""},
		{"KOLO_NETWORK_INTERFACE wins", []string{jobenv.NetworkInterface, "lo", jobenv.HorovodNetworkInterface, "nosuch0"}, ""},
		{"missing KOLO_NETWORK_INTERFACE", []string{jobenv.NetworkInterface, "nosuch0"}, jobenv.NetworkInterface},
		{"missing HOROVOD_GLOO_IFACE", []string{jobenv.HorovodNetworkInterface, "nosuch0"}, jobenv.HorovodNetworkInterface},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			env := func(r int) map[string]string {
				return ompi(r, 2, dir, append([]string{"OMPI_COMM_WORLD_LOCAL_RANK", "0", "OMPI_COMM_WORLD_LOCAL_SIZE", "1"}, tc.vars...)...)
			}
			if tc.wantErr != "" {
				if _, err := Join(context.Background(), env(0), "node1", Options{Log: quiet}); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Errorf("rank 0: %v, want an error naming %s", err, tc.wantErr)
				}
				return
			}
			// node1 resolves nowhere: rank 1 finds rank 0 only at the interface's address.
			ss, errs := joinAll(t, []map[string]string{env(0), env(1)}, 0, 3*time.Second)
			if errs[0] != nil || errs[1] != nil {
				t.Fatal(errs)
			}
			defer ss[0].Close()
			if !strings.HasPrefix(ss[1].Job.Rendezvous, "127.0.0.1:") || ss[0].Job.CrossSize != 0 {
				t.Errorf("rank 1 got %q (cross size %d), want lo's address and the cross rank left to the rendezvous", ss[1].Job.Rendezvous, ss[0].Job.CrossSize)
			}
		})
	}
}

// A rendezvous file that others could have written or read is not trusted.
func TestReadRecordRefusesLooseFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "job")
	os.WriteFile(p, []byte("addr=h:1\nnonce=n\n"), 0o644)
	os.Chmod(p, 0o644)
	if _, err := readRecord(p); err == nil || !strings.Contains(err.Error(), "want 0600") {
		t.Errorf("mode 0644: %v", err)
	}
	os.Chmod(p, 0o600)
	if r, err := readRecord(p); err != nil || r.addr != "h:1" {
		t.Errorf("mode 0600: %+v, %v", r, err)
	}
	if os.Geteuid() == 0 { // only root can give the file to another user
		os.Chown(p, 65534, 65534)
		if _, err := readRecord(p); err == nil || !strings.Contains(err.Error(), "belongs to uid 65534") {
			t.Errorf("another user's file: %v", err)
		}
	}
}

// Secrets as a user gives them: strong enough for auth.CheckStrength, and different.
var (
	testSecret  = strings.Repeat("5e", 16)
	givenSecret = strings.Repeat("61", 16)
)
