package proc

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kolo-dl/kolo/internal/launch/layout"
	"github.com/kolo-dl/kolo/internal/settings"
)

// SSHStarter starts workers on other machines with the system ssh client, so that ~/.ssh/config,
// agents and ProxyJump work as they do for the user. Nothing of kolo needs to be installed on the
// remote host: a small POSIX sh wrapper, sent over ssh's stdin together with the worker's
// environment (the job secret included, so it never appears on a command line), changes to the
// launcher's working directory, starts the program in its own process group with setsid, and then
// keeps reading stdin: a "TERM", "INT" or "KILL" line signals the group, and end of input (the
// launcher or the connection died) kills it, so no worker outlives its launcher.
type SSHStarter struct {
	Port           int           // -p; 0 leaves it to ssh (its config or 22)
	IdentityFile   string        // -i
	Options        []string      // extra "-o" options, e.g. StrictHostKeyChecking=accept-new
	ConnectTimeout time.Duration // ssh's ConnectTimeout; default 10 s
	Forward        []string      // names of variables (-x) forwarded even where ForwardedEnv would keep them back
	Program        string        // the ssh client; default "ssh" (tests substitute a fake)
	Dir            string        // working directory on the hosts; default the launcher's

	mu       sync.Mutex
	starting map[string]chan struct{} // per host: sessions being set up (sshd's MaxStartups)
}

// maxStartingPerHost bounds the ssh sessions set up at once on one host: sshd's default
// MaxStartups (10:30:100) starts refusing unauthenticated connections at 10.
const maxStartingPerHost = 8

// Markers exchanged with the remote wrapper. They are long and odd enough never to be a line a
// user's program or shell writes.
const (
	payloadEnd    = "__kolo_payload_end_5d1c__"
	startedMarker = "__kolo_started_5d1c__"
	checkedMarker = "__kolo_checked_5d1c__"
)

// bootstrap is the remote command given to ssh: the one thing on the remote command line. It reads
// the wrapper script from stdin up to payloadEnd and evaluates it. It is one line with no '!' and no
// double-quoted '$' so that any login shell (bash, zsh, fish, csh) passes it to sh untouched.
const bootstrap = `sh -c 'nl=$(printf "\nx"); nl=${nl%x}; s=; while IFS= read -r l && [ "$l" != ` + payloadEnd + ` ]; do s=$s$l$nl; done; eval "$s"'`

var shellName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// perHost reports whether the variable k describes the launcher's own host or shell session, and
// so is not sent to a remote worker: horovodrun's list (BASH_FUNC_*, OLDPWD, *CUDA_VISIBLE_DEVICES*,
// as each host has its own GPUs, and HOROVOD_SECRET_KEY, which kolo reads as its secret's second
// spelling; KOLO_SECRET and its file must reach the worker), and the names the remote shell and
// sshd set for themselves.
func perHost(k string) bool {
	switch k {
	case "OLDPWD", "PWD", "HOSTNAME", "SHLVL", "_", "SSH_CLIENT", "SSH_CONNECTION", "SSH_TTY", "SSH_AUTH_SOCK":
		return true
	}
	return slices.Contains(settings.Secret.Horovod, k) || strings.HasPrefix(k, "BASH_FUNC_") || strings.Contains(k, "CUDA_VISIBLE_DEVICES")
}

// ForwardedEnv keeps the entries of env ("K=V") that a remote worker gets, as horovodrun does:
// every variable of the launcher but the per-host ones (perHost), so that NCCL_SOCKET_IFNAME,
// OMP_NUM_THREADS or a script's own settings made in the launching shell hold on every host. The
// names in extra (-x NAME[=VALUE]) are forwarded even where perHost would keep them back. Names
// that are not shell names cannot be exported and are dropped. Later entries win, as in exec.
func ForwardedEnv(env []string, extra []string) []string {
	allowed := map[string]bool{}
	for _, x := range extra {
		name, _, _ := strings.Cut(x, "=")
		allowed[name] = true
	}
	idx := map[string]int{}
	var out []string
	for _, kv := range env {
		k, _, ok := strings.Cut(kv, "=")
		if !ok || !shellName.MatchString(k) || perHost(k) && !allowed[k] {
			continue
		}
		if i, seen := idx[k]; seen {
			out[i] = kv
			continue
		}
		idx[k] = len(out)
		out = append(out, kv)
	}
	return out
}

// shellQuote makes s one sh word.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// workerScript is the wrapper the remote sh runs for one worker. fd 4 is the session's stderr,
// given to the program; the wrapper's own stderr goes to /dev/null so that sh's job notices
// ("Terminated") never reach the rank's output.
func workerScript(dir string, env, argv []string) (string, error) {
	var b strings.Builder
	b.WriteString("exec 4>&2 2>/dev/null 3<&0\n")
	fmt.Fprintf(&b, "cd %s || { printf 'kolo: cannot change to directory %%s on %%s\\n' %s \"$(hostname)\" >&4; exit 126; }\n", shellQuote(dir), shellQuote(dir))
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		fmt.Fprintf(&b, "export %s=%s\n", k, shellQuote(v))
	}
	b.WriteString("command -v setsid >/dev/null || { printf 'kolo: setsid not found on %s (it comes with util-linux or busybox)\\n' \"$(hostname)\" >&4; exit 127; }\n")
	// The marker goes out before the program can write a partial line it would be glued to.
	fmt.Fprintf(&b, "printf '%s\\n' >&4\n", startedMarker)
	b.WriteString("setsid")
	for _, a := range argv {
		b.WriteString(" " + shellQuote(a))
	}
	b.WriteString(" </dev/null 2>&4 3<&- 4>&- &\npid=$!\n")
	// The watcher owns the session's stdin from here on.
	b.WriteString(`{ while IFS= read -r c; do case $c in TERM|INT|KILL) kill -"$c" -"$pid";; esac; done; kill -KILL -"$pid"; } <&3 >/dev/null 4>&- &` + "\n")
	b.WriteString("w=$!\nexec 3<&-\nwait \"$pid\"; rc=$?\n")
	// Whatever the program left in its group goes with it.
	b.WriteString("kill -KILL -\"$pid\"; kill \"$w\"; exit \"$rc\"\n")
	return finishPayload(b.String())
}

// checkScript is what the preflight runs on each host: the same bootstrap, the same directory.
func checkScript(dir string) (string, error) {
	var b strings.Builder
	b.WriteString("exec 4>&2 2>/dev/null\n")
	fmt.Fprintf(&b, "cd %s || { printf 'cannot change to directory %%s (the launcher'\\''s working directory) on %%s\\n' %s \"$(hostname)\" >&4; exit 3; }\n", shellQuote(dir), shellQuote(dir))
	b.WriteString("command -v setsid >/dev/null || { printf 'setsid not found on %s (it comes with util-linux or busybox)\\n' \"$(hostname)\" >&4; exit 4; }\n")
	fmt.Fprintf(&b, "printf '%s\\n'\n", checkedMarker)
	return finishPayload(b.String())
}

func finishPayload(script string) (string, error) {
	if slices.Contains(strings.Split(script, "\n"), payloadEnd) {
		return "", fmt.Errorf("an environment value or argument contains the line %q, which kolo uses as a marker", payloadEnd)
	}
	return script + payloadEnd + "\n", nil
}

// args is the ssh command line for host, ending with the bootstrap.
func (s *SSHStarter) args(host string) []string {
	timeout := s.ConnectTimeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	secs := max(1, int(timeout.Round(time.Second)/time.Second))
	a := []string{"-T", "-o", "BatchMode=yes", "-o", "ConnectTimeout=" + strconv.Itoa(secs)}
	if s.Port > 0 {
		a = append(a, "-p", strconv.Itoa(s.Port))
	}
	if s.IdentityFile != "" {
		a = append(a, "-i", s.IdentityFile)
	}
	for _, o := range s.Options {
		a = append(a, "-o", o)
	}
	// "--": whatever the host is called, ssh never reads it as an option (-oProxyCommand=...).
	return append(a, "--", host, bootstrap)
}

func (s *SSHStarter) program() string { return cmp.Or(s.Program, "ssh") }

// dir is the working directory on the hosts: the worker's, else s.Dir, else the launcher's.
func (s *SSHStarter) dir(worker string) (string, error) {
	if d := cmp.Or(worker, s.Dir); d != "" {
		return d, nil
	}
	d, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("launcher working directory: %w", err)
	}
	return d, nil
}

// acquire waits for a free set-up place on host.
func (s *SSHStarter) acquire(ctx context.Context, host string) (release func(), err error) {
	s.mu.Lock()
	if s.starting == nil {
		s.starting = map[string]chan struct{}{}
	}
	sem := s.starting[host]
	if sem == nil {
		sem = make(chan struct{}, maxStartingPerHost)
		s.starting[host] = sem
	}
	s.mu.Unlock()
	select {
	case sem <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting to open an ssh session to %s: %w", host, ctx.Err())
	}
	var once sync.Once
	return func() { once.Do(func() { <-sem }) }, nil
}

// Start opens an ssh session to w.Slot.Host and starts w there.
func (s *SSHStarter) Start(ctx context.Context, w Worker) (Process, error) {
	if len(w.Argv) == 0 {
		return nil, errors.New("no command to run")
	}
	dir, err := s.dir(w.Dir)
	if err != nil {
		return nil, err
	}
	payload, err := workerScript(dir, ForwardedEnv(w.Env, s.Forward), w.Argv)
	if err != nil {
		return nil, err
	}
	host := w.Slot.Host
	release, err := s.acquire(ctx, host)
	if err != nil {
		return nil, err
	}
	p, err := s.start(host, payload, release)
	if err != nil {
		release()
		return nil, err
	}
	return p, nil
}

type sshProcess struct {
	host   string
	cmd    *exec.Cmd
	stdin  *os.File
	stdout io.ReadCloser
	stderr io.ReadCloser // filtered: the started marker removed

	filterDone chan struct{}

	mu        sync.Mutex
	started   bool   // the remote wrapper started the program
	lastLine  string // last line ssh itself wrote before the program started
	stdinGone bool
	exited    chan struct{}
}

func (s *SSHStarter) start(host, payload string, release func()) (*sshProcess, error) {
	cmd := exec.Command(s.program(), s.args(host)...)
	// Its own process group, so that the terminal's Ctrl-C reaches only the launcher, which then
	// stops ranks in order (TERM, grace, KILL) instead of every ssh dropping its session at once.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	r, w, err := pipes(3) // stdin, stdout, ssh's own stderr
	if err != nil {
		return nil, err
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = r[0], w[1], w[2]
	err = cmd.Start()
	closeAll(r[0], w[1], w[2])
	if err != nil {
		closeAll(w[0], r[1], r[2])
		return nil, fmt.Errorf("start %s: %w", s.program(), err)
	}
	inW, rawErrR := w[0], r[2]
	errR, errW := io.Pipe()
	p := &sshProcess{host: host, cmd: cmd, stdin: inW, stdout: r[1], stderr: errR,
		filterDone: make(chan struct{}), exited: make(chan struct{})}
	// The payload may exceed a pipe's buffer and ssh reads stdin only once the session is open.
	go func() {
		if _, err := io.WriteString(inW, payload); err != nil {
			p.mu.Lock()
			p.stdinGone = true
			p.mu.Unlock()
		}
	}()
	go p.filterStderr(rawErrR, errW, release)
	return p, nil
}

// filterStderr passes ssh's stderr on, minus the wrapper's started marker, and remembers the
// last line ssh wrote before it (its own complaint, when the session failed).
func (p *sshProcess) filterStderr(r io.ReadCloser, w *io.PipeWriter, release func()) {
	defer close(p.filterDone)
	defer release()
	defer r.Close()
	br := bufio.NewReader(r)
	for {
		line, err := br.ReadString('\n')
		if strings.TrimRight(line, "\r\n") == startedMarker {
			p.mu.Lock()
			p.started = true
			p.mu.Unlock()
			release()
			// From here on the stream is the program's own: copy it as it comes.
			_, err = io.Copy(w, br)
			w.CloseWithError(err)
			return
		}
		if line != "" {
			if t := strings.TrimSpace(line); t != "" {
				p.mu.Lock()
				p.lastLine = t
				p.mu.Unlock()
			}
			if _, werr := io.WriteString(w, line); werr != nil {
				io.Copy(io.Discard, br)
				return
			}
		}
		if err != nil {
			w.Close()
			return
		}
	}
}

func (p *sshProcess) Stdout() io.Reader { return p.stdout }
func (p *sshProcess) Stderr() io.Reader { return p.stderr }

// Signal asks the remote wrapper to signal the program's process group. Before the program has
// started, or for SIGKILL when the session does not end soon after, the local ssh is killed
// instead: the remote end then sees its input end and kills whatever it started.
func (p *sshProcess) Signal(sig syscall.Signal) error {
	p.mu.Lock()
	started, gone := p.started, p.stdinGone
	p.mu.Unlock()
	if !started || gone {
		return p.killLocal(sig)
	}
	line, ok := map[syscall.Signal]string{syscall.SIGTERM: "TERM\n", syscall.SIGINT: "INT\n", syscall.SIGKILL: "KILL\n"}[sig]
	if !ok {
		return fmt.Errorf("ssh worker on %s: signal %v is not forwarded", p.host, sig)
	}
	_, err := io.WriteString(p.stdin, line)
	if sig == syscall.SIGKILL {
		p.mu.Lock()
		p.stdinGone = true
		p.mu.Unlock()
		p.stdin.Close()
		go func() {
			select {
			case <-p.exited:
			case <-time.After(3 * time.Second):
				p.cmd.Process.Kill()
			}
		}()
	}
	if err != nil {
		return p.killLocal(sig)
	}
	return nil
}

func (p *sshProcess) killLocal(sig syscall.Signal) error {
	if sig != syscall.SIGKILL {
		sig = syscall.SIGTERM
	}
	return p.cmd.Process.Signal(sig)
}

// Wait returns how the remote program ended. ssh reports the remote exit status; a status above
// 128 is read as the signal that killed the program, as a shell reports it (the remote sh cannot
// tell "killed by signal 9" from "exit 137" apart). A session that ended before the program
// started is reported as an error carrying ssh's last line.
func (p *sshProcess) Wait() Exit {
	err := p.cmd.Wait()
	close(p.exited)
	<-p.filterDone
	p.mu.Lock()
	started, last := p.started, p.lastLine
	p.stdinGone = true
	p.mu.Unlock()
	p.stdin.Close()
	e := exitOf(err)
	switch {
	case e.Err != nil:
		return Exit{Code: -1, Err: fmt.Errorf("ssh to %s: %w", p.host, err)}
	case e.Signal != 0 || e.Code == 0:
		// A signal: the local ssh was killed (a session that would not end), and the remote side
		// killed its group.
		return e
	}
	code := e.Code
	if !started {
		return Exit{Code: code, Err: fmt.Errorf("ssh to %s failed before the program started (exit %d): %s", p.host, code, cmp.Or(last, "no message"))}
	}
	if code > 128 && code <= 128+64 {
		return Exit{Code: -1, Signal: syscall.Signal(code - 128)}
	}
	return Exit{Code: code}
}

// Check runs a short command on every host in parallel, so that a host that cannot be reached, a
// key that is refused or a working directory that does not exist there is reported (naming the
// host and quoting ssh) before any rank starts. ctx bounds the whole check (--start-timeout).
func (s *SSHStarter) Check(ctx context.Context, hosts []string) error {
	dir, err := s.dir("")
	if err != nil {
		return err
	}
	payload, err := checkScript(dir)
	if err != nil {
		return err
	}
	errs := make([]error, len(hosts))
	var wg sync.WaitGroup
	for i, h := range hosts {
		wg.Go(func() { errs[i] = s.checkHostRetrying(ctx, h, payload) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// refusedRetryFor bounds how long the check keeps trying a host that refuses the connection: an
// sshd that is still starting (a container started beside the launcher's, a node booting) refuses
// for a moment, and the job should not fail for it; a host with no sshd at all is reported after
// this long, or at --start-timeout if that comes first.
const refusedRetryFor = 15 * time.Second

var errRefused = errors.New("connection refused")

// checkHostRetrying is checkHost, tried again while the host refuses the connection.
func (s *SSHStarter) checkHostRetrying(ctx context.Context, host, payload string) error {
	start := time.Now()
	wait := 250 * time.Millisecond
	for {
		err := s.checkHost(ctx, host, payload)
		if !errors.Is(err, errRefused) || time.Since(start)+wait > refusedRetryFor {
			if errors.Is(err, errRefused) {
				err = fmt.Errorf("%w (refused for %s)", err, time.Since(start).Round(100*time.Millisecond))
			}
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		wait = min(2*wait, 2*time.Second)
	}
}

func (s *SSHStarter) checkHost(ctx context.Context, host, payload string) error {
	start := time.Now()
	cmd := exec.CommandContext(ctx, s.program(), s.args(host)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Stdin = strings.NewReader(payload)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.WaitDelay = time.Second
	err := cmd.Run()
	if err == nil && strings.Contains(out.String(), checkedMarker) {
		return nil
	}
	said := cmp.Or(strings.TrimSpace(errb.String()), "no message")
	port := "ssh's default port"
	if s.Port > 0 {
		port = "port " + strconv.Itoa(s.Port)
	}
	if ctx.Err() != nil {
		return fmt.Errorf("host %s: no answer over ssh (%s) within %s (--start-timeout); ssh said: %s",
			host, port, time.Since(start).Round(100*time.Millisecond), said)
	}
	var ee *exec.ExitError
	switch {
	case err != nil && !errors.As(err, &ee):
		return fmt.Errorf("host %s: run the ssh client: %w", host, err)
	case ee != nil && ee.ExitCode() == 255 && strings.Contains(said, "Connection refused"):
		return fmt.Errorf("host %s: ssh (%s) failed: %s: %w", host, port, said, errRefused)
	case ee != nil && ee.ExitCode() == 255:
		return fmt.Errorf("host %s: ssh (%s) failed: %s", host, port, said)
	case err != nil:
		return fmt.Errorf("host %s: %s", host, said)
	}
	return fmt.Errorf("host %s: the check command printed no confirmation (is the login shell printing or exiting early?); stdout: %q, stderr: %s", host, out.String(), said)
}

// HostStarter starts ranks of this machine locally and the others through Remote.
type HostStarter struct {
	Local, Remote Starter
}

func (h HostStarter) Start(ctx context.Context, w Worker) (Process, error) {
	if layout.IsLocal(w.Slot.Host) {
		return h.Local.Start(ctx, w)
	}
	if h.Remote == nil {
		return nil, fmt.Errorf("host %q is not this machine and no remote starter is configured", w.Slot.Host)
	}
	return h.Remote.Start(ctx, w)
}
