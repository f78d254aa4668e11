// Package bootstrap gets a worker process from its environment to the point where world.Connect
// can run: which job it is in (jobenv.Detect), the job secret, and the rendezvous address. Under
// kolo run all three are given. Under mpirun and srun nobody hosts a rendezvous, so rank 0 hosts
// one in its own process and tells the other ranks where it is, either through the address and
// secret the user gave every rank (KOLO_RENDEZVOUS_ADDR with KOLO_SECRET or KOLO_SECRET_FILE) or
// through a file of mode 0600 in a directory the ranks share (~/.kolo/rendezvous by default),
// named by the launcher's job id.
//
// It must not weaken authentication: the rendezvous server admits only holders of the secret, and a
// secret it generates travels only through that private file. It does not connect ranks to each
// other; that is package world's job.
package bootstrap

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/kolo-dl/kolo/internal/auth"
	"github.com/kolo-dl/kolo/internal/jobenv"
	"github.com/kolo-dl/kolo/internal/netif"
	"github.com/kolo-dl/kolo/internal/rendezvous"
)

// Options adjust Join. Zero values are the defaults.
type Options struct {
	// Timeout bounds how long a rank waits for rank 0 to publish the rendezvous; default 60 s.
	Timeout time.Duration
	// Log receives what rank 0 did to host the rendezvous; default slog.Default().
	Log *slog.Logger
}

// Session is this process's place in its job, ready for world.Connect. Close it after the world.
type Session struct {
	Job      jobenv.Job
	Launcher jobenv.Launcher
	Secret   []byte // nil for a job of one rank

	server *rendezvous.Server // hosted here (rank 0 under mpirun or srun)
	file   string             // published here; removed by Close
	nonce  string
}

// nonceKey is where rank 0's server holds the nonce of its rendezvous file, so that a rank that
// read a stale file (left by a crashed job with the same id) does not join the wrong server.
const nonceKey = "bootstrap/nonce"

// Join reads the job from env (os.Environ as a map) and, under mpirun or srun, hosts or finds the
// rendezvous. hostname is this machine's name (os.Hostname).
func Join(ctx context.Context, env map[string]string, hostname string, opt Options) (*Session, error) {
	if opt.Timeout <= 0 {
		opt.Timeout = 60 * time.Second
	}
	if opt.Log == nil {
		opt.Log = slog.Default()
	}
	d, err := jobenv.Detect(env, hostname)
	if err != nil {
		return nil, err
	}
	s := &Session{Job: d.Job, Launcher: d.Launcher}
	// An elastic worker meets its launcher at the rendezvous whatever its first world's size:
	// later rounds may have more ranks.
	if d.Job.Size == 1 && env[jobenv.Elastic] != "1" {
		return s, nil
	}
	secret, err := auth.JobSecret("", env) // nil when the user gave none
	if err != nil {
		return nil, fmt.Errorf("rank %d: %w", d.Job.Rank, err)
	}
	if d.Launcher == jobenv.KoloRun {
		if secret == nil {
			return nil, fmt.Errorf("rank %d: no job secret in %s or %s (workers must be started by kolo run, or given the job's secret)", d.Job.Rank, jobenv.Secret, jobenv.SecretFile)
		}
		s.Secret = secret
		return s, nil
	}

	// mpirun or srun: rank 0 hosts the rendezvous.
	given := secret != nil && s.Job.Rendezvous != ""
	var file string
	if !given {
		dir, err := rendezvousDir(env)
		if err != nil {
			return nil, fmt.Errorf("rank %d: %w", d.Job.Rank, err)
		}
		file = filepath.Join(dir, s.Job.JobID)
	}
	if s.Job.Rank == 0 {
		err = s.host(secret, file, env, opt.Log)
	} else if given {
		s.Secret = secret
	} else {
		err = s.find(ctx, secret, file, opt.Timeout)
	}
	if err != nil {
		return nil, err
	}
	if err := s.Job.Validate(); err != nil {
		s.Close()
		return nil, fmt.Errorf("rank %d: %w", s.Job.Rank, err)
	}
	return s, nil
}

// host starts the rendezvous server of the job here and, unless every rank was given its address
// and secret, publishes them in file. On several hosts it advertises the address of the interface
// env names (jobenv.Interface, as every rank reads it), else this host's name.
func (s *Session) host(secret []byte, file string, env map[string]string, log *slog.Logger) error {
	j := &s.Job
	generated := secret == nil
	if generated {
		hexSecret, err := auth.NewSecret()
		if err != nil {
			return err
		}
		secret = []byte(hexSecret)
	}
	var iface net.IP
	if ifaces, ifaceVar := jobenv.Interface(env); ifaces != "" && j.LocalSize != j.Size {
		ip, _, err := netif.InterfaceIP(ifaces)
		if err != nil {
			return fmt.Errorf("rank 0: %s: %w", ifaceVar, err)
		}
		iface = ip
	}
	listen, advertise, err := listenAddr(*j, iface)
	if err != nil {
		return fmt.Errorf("rank 0: %w", err)
	}
	srv := rendezvous.NewServer(secret)
	addr, err := srv.Listen(listen)
	if err != nil {
		return fmt.Errorf("rank 0: host the rendezvous of %s job %s: %w", s.Launcher, j.JobID, err)
	}
	_, port, _ := net.SplitHostPort(addr.String())
	if advertise == "" {
		host := j.Hostname // resolvable by the other nodes under Slurm and most MPI set-ups
		switch {
		case j.LocalSize == j.Size:
			host = "127.0.0.1"
		case iface != nil:
			host = iface.String()
		}
		advertise = net.JoinHostPort(host, port)
	}
	j.Rendezvous = advertise
	s.server, s.Secret = srv, secret
	if file == "" {
		log.Debug("kolo: rank 0 hosts the rendezvous", "launcher", s.Launcher, "job", j.JobID, "addr", advertise)
		return nil
	}
	s.nonce = newNonce()
	if err := srv.Set(nonceKey, []byte(s.nonce)); err != nil {
		srv.Close()
		return err
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "# kolo rendezvous of %s job %s; rank 0 removes this file when the job ends\n", s.Launcher, j.JobID)
	fmt.Fprintf(&b, "addr=%s\nnonce=%s\n", advertise, s.nonce)
	if generated { // a secret the user gave stays where the user put it
		fmt.Fprintf(&b, "secret=%s\n", secret)
	}
	if err := writePrivate(file, b.Bytes()); err != nil {
		srv.Close()
		return fmt.Errorf("rank 0: publish the rendezvous address: %w", err)
	}
	s.file = file
	log.Debug("kolo: rank 0 hosts the rendezvous", "launcher", s.Launcher, "job", j.JobID, "addr", advertise, "file", file)
	return nil
}

// find waits for rank 0's file, then checks that the server it names is live and is the one that
// wrote it (a file left by a crashed job with the same id names a dead or foreign server).
func (s *Session) find(ctx context.Context, secret []byte, file string, timeout time.Duration) error {
	j := &s.Job
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	backoff := 20 * time.Millisecond
	var last error
	for {
		rec, err := readRecord(file)
		switch {
		case err == nil:
			if secret != nil {
				rec.secret = secret
			}
			if rec.secret == nil {
				last = fmt.Errorf("%s holds no secret and neither %s nor %s is set here", file, jobenv.Secret, jobenv.SecretFile)
			} else if last = verify(ctx, rec); last == nil {
				if j.Rendezvous == "" {
					j.Rendezvous = rec.addr
				}
				s.Secret = rec.secret
				return nil
			}
		case errors.Is(err, os.ErrNotExist):
			last = fmt.Errorf("%s does not exist yet", file)
		default:
			last = err
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("rank %d of %s job %s: waited %s for rank 0 to publish the rendezvous address and secret in %s (last: %v). "+
				"Is rank 0 running, and is %s shared by every node (set %s to a shared directory)? "+
				"Or give every rank %s=HOST:PORT (rank 0 listens there) and %s or %s (mpirun -x NAME, srun --export=ALL)",
				j.Rank, s.Launcher, j.JobID, time.Since(start).Round(time.Millisecond), file, last,
				filepath.Dir(file), jobenv.RendezvousDir, jobenv.Rendezvous, jobenv.Secret, jobenv.SecretFile)
		case <-t.C:
		}
		backoff = min(2*backoff, 500*time.Millisecond)
	}
}

type record struct {
	addr, nonce string
	secret      []byte
}

func readRecord(file string) (record, error) {
	f, err := os.Open(file)
	if err != nil {
		return record{}, err
	}
	defer f.Close()
	// Only a file this user wrote, readable by nobody else, may say where the job meets: in a
	// shared directory another user's file would hand the job to a server of their choosing.
	fi, err := f.Stat()
	if err != nil {
		return record{}, err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Getuid() {
		return record{}, fmt.Errorf("%s belongs to uid %d, not to this user (%d): ignored", file, st.Uid, os.Getuid())
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return record{}, fmt.Errorf("%s has mode %v, want 0600: ignored", file, fi.Mode().Perm())
	}
	b, err := io.ReadAll(io.LimitReader(f, 1<<16))
	if err != nil {
		return record{}, err
	}
	var r record
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), "=")
		switch {
		case !ok:
		case k == "addr":
			r.addr = v
		case k == "nonce":
			r.nonce = v
		case k == "secret":
			r.secret = []byte(v)
		}
	}
	if r.addr == "" || r.nonce == "" {
		return record{}, fmt.Errorf("%s is incomplete (being written?)", file)
	}
	return r, nil
}

// verify dials the server a record names and checks it holds the record's nonce.
func verify(ctx context.Context, r record) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second) // a live server answers in milliseconds
	defer cancel()
	c, err := rendezvous.Dial(ctx, r.addr, r.secret)
	if err != nil {
		return err
	}
	defer c.Close()
	v, ok, err := c.TryGet(ctx, nonceKey)
	switch {
	case err != nil:
		return fmt.Errorf("rendezvous %s: %w", r.addr, err)
	case !ok || string(v) != r.nonce:
		return fmt.Errorf("rendezvous %s belongs to another job (a stale file?)", r.addr)
	}
	return nil
}

// Close stops the rendezvous this process hosted and removes its file, if it is still ours.
func (s *Session) Close() error {
	if s == nil {
		return nil
	}
	var errs []error
	if s.file != "" {
		if r, err := readRecord(s.file); err == nil && r.nonce == s.nonce {
			if err := os.Remove(s.file); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
		s.file = ""
	}
	if s.server != nil {
		errs = append(errs, s.server.Close())
		s.server = nil
	}
	return errors.Join(errs...)
}

// listenAddr is where rank 0's server listens and, when the user chose the address, what the other
// ranks dial; iface is the network interface's address, if one was named. It listens where the
// other ranks reach rank 0, and no wider: loopback in a job on one host; the address here of the
// rendezvous host they are given; the interface's address; the address here of this host's name;
// every interface only when none of these says (a name that resolves to loopback here, or not at
// all; an address behind NAT).
func listenAddr(j jobenv.Job, iface net.IP) (listen, advertise string, err error) {
	at := func(host, port string) string {
		if iface != nil {
			return net.JoinHostPort(iface.String(), port)
		}
		if ip, ok := netif.AddressHere(host); ok {
			return net.JoinHostPort(ip.String(), port)
		}
		return net.JoinHostPort("", port)
	}
	if j.Rendezvous == "" {
		if j.LocalSize == j.Size {
			return "127.0.0.1:0", "", nil
		}
		return at(j.Hostname, "0"), "", nil
	}
	host, port, err := net.SplitHostPort(j.Rendezvous)
	if err != nil || port == "0" || port == "" {
		return "", "", fmt.Errorf("%s=%q: want HOST:PORT with a fixed port", jobenv.Rendezvous, j.Rendezvous)
	}
	if ip := net.ParseIP(host); (ip != nil && ip.IsLoopback()) || host == "localhost" {
		return j.Rendezvous, j.Rendezvous, nil
	}
	if ip, ok := netif.AddressHere(host); ok { // the address given wins over the interface's
		return net.JoinHostPort(ip.String(), port), j.Rendezvous, nil
	}
	return at(host, port), j.Rendezvous, nil
}

func rendezvousDir(env map[string]string) (string, error) {
	if d := strings.TrimSpace(env[jobenv.RendezvousDir]); d != "" {
		return d, nil
	}
	home := env["HOME"]
	if home == "" {
		var err error
		if home, err = os.UserHomeDir(); err != nil {
			return "", fmt.Errorf("no home directory for the rendezvous file (set %s): %w", jobenv.RendezvousDir, err)
		}
	}
	return filepath.Join(home, ".kolo", "rendezvous"), nil
}

// writePrivate writes data to path atomically (readers see the old file or the new one) with mode
// 0600, creating its directory with mode 0700.
func writePrivate(path string, data []byte) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
}

func newNonce() string {
	b := make([]byte, 16)
	rand.Read(b)
	return hex.EncodeToString(b)
}
