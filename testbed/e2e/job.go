package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/auth"
	"github.com/kolo-dl/kolo/internal/endpoint"
	"github.com/kolo-dl/kolo/internal/launch"
	"github.com/kolo-dl/kolo/internal/launch/layout"
	"github.com/kolo-dl/kolo/internal/launch/proc"
	"github.com/kolo-dl/kolo/internal/observe/relay"
	"github.com/kolo-dl/kolo/internal/observe/report"
	"github.com/kolo-dl/kolo/internal/rendezvous"
	"github.com/kolo-dl/kolo/internal/settings"
	"github.com/kolo-dl/kolo/internal/world"
)

// WorkerEnv is set in a re-executed test binary to the scenario it must run as a rank.
var WorkerEnv = settings.E2EScenario.Name

// Main is called from a test package's TestMain: in a worker it runs the scenario and exits; in
// one end of a TCPStream, that end.
func Main() {
	if role := os.Getenv(StreamEnv); role != "" {
		if err := runStream(role); err != nil {
			fmt.Fprintln(os.Stderr, "tcp stream:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if s := os.Getenv(WorkerEnv); s != "" {
		if err := Run(s); err != nil {
			fmt.Fprintln(os.Stderr, "E2E-FAIL:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
}

// Output collects a job's output safely across the runner's goroutines.
type Output struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (o *Output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.Write(p)
}

func (o *Output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.String()
}

// Job is one launched test job.
type Job struct {
	Results        []proc.Result
	First          *proc.Result           // the rank the failure traces back to (proc.Blame), nil if none
	Records        map[int]report.Failure // the failure records the ranks sent, by rank
	Stdout, Stderr *Output
	Elapsed        time.Duration
	Intrusions     int
}

// Host places ranks: Name is the host name ranks report (groups shared memory), Wrap is prepended
// to the worker's argv (e.g. "ip netns exec h1") to run it somewhere else.
type Host struct {
	Name  string
	Slots int
	Wrap  []string
}

// Options adjust Launch. Zero values are the defaults.
type Options struct {
	Env       map[string]string // extra environment for every rank
	Listen    string            // rendezvous listen address (default 127.0.0.1:0)
	Advertise string            // host ranks dial to reach the rendezvous (default: Listen's)
	Grace     time.Duration     // SIGTERM-to-SIGKILL grace when a rank fails (default 2 s)
	// Intrude, while the job runs, connects to the rendezvous and to every rank's peer listener
	// with the wrong secret and with random bytes; Job.Intrusions counts the connections made.
	Intrude bool
}

// Launch runs scenario on the hosts' slots by re-executing this test binary, with a rendezvous
// served from this process.
func Launch(t testing.TB, scenario string, hosts []Host, np int, o Options) *Job {
	t.Helper()
	env, listen, advertise := o.Env, o.Listen, o.Advertise
	if o.Grace <= 0 {
		o.Grace = 2 * time.Second
	}
	secret, err := auth.NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	srv := rendezvous.NewServer([]byte(secret))
	if listen == "" {
		listen = "127.0.0.1:0"
	}
	addr, err := srv.Listen(listen)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if advertise == "" {
		advertise = addr.String()
	} else {
		_, port, _ := net.SplitHostPort(addr.String())
		advertise = net.JoinHostPort(advertise, port)
	}
	lh := make([]layout.Host, len(hosts))
	wrap := map[string][]string{}
	for i, h := range hosts {
		lh[i] = layout.Host{Name: h.Name, Slots: h.Slots}
		wrap[h.Name] = h.Wrap
	}
	slots, err := layout.Plan(lh, np)
	if err != nil {
		t.Fatal(err)
	}
	jobID := launch.NewJobID()
	workers := make([]proc.Worker, len(slots))
	for i, s := range slots {
		e := launch.WorkerEnv(s, advertise, jobID, secret, env, []string{WorkerEnv + "=" + scenario})
		argv := append(append([]string(nil), wrap[s.Host]...), os.Args[0], "-test.run=^$")
		workers[i] = proc.Worker{Slot: s, Argv: argv, Env: e}
	}
	job := &Job{Stdout: &Output{}, Stderr: &Output{}}
	store := relay.Local{S: srv.Store}
	r := &proc.Runner{Starter: proc.LocalStarter{}, Stdout: job.Stdout, Stderr: job.Stderr, GracePeriod: o.Grace}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	start := time.Now()
	intruded := make(chan int, 1)
	if o.Intrude {
		go func() { intruded <- intrude(ctx, srv, addr.String(), jobID, np) }()
	} else {
		intruded <- 0
	}
	job.Results, job.First = r.Run(ctx, workers)
	if job.First != nil {
		// As kolo run does: the ranks' failure records trace the failure to its rank.
		job.Records, _ = relay.Failures(ctx, store, jobID, len(slots))
		job.First = proc.Blame(job.Results, job.First, job.Records)
	}
	job.Elapsed = time.Since(start)
	cancel()
	job.Intrusions = <-intruded
	return job
}

// LocalHosts is one host, this machine, with np slots.
func LocalHosts(np int) []Host { return []Host{{Name: "localhost", Slots: np}} }

// intrude plays a stranger on the network: once every rank has published its peer listener, it
// connects to each listener and to the rendezvous, once sending random bytes and once running the
// handshake with a wrong secret. It returns how many connections it made.
func intrude(ctx context.Context, srv *rendezvous.Server, rvAddr, jobID string, np int) int {
	targets := []string{rvAddr}
	for r := 0; r < np; r++ {
		v, err := srv.Get(ctx, world.RecordKey(jobID, r))
		if err != nil {
			return 0
		}
		targets = append(targets, strings.SplitN(string(v), "|", 2)[0])
	}
	made := 0
	for _, t := range targets {
		for _, mode := range []string{"garbage", "wrong-secret"} {
			dctx, cancel := context.WithTimeout(ctx, time.Second)
			conn, err := endpoint.Dial(dctx, t)
			cancel()
			if err != nil {
				continue
			}
			made++
			if mode == "garbage" {
				junk := make([]byte, 4096)
				rand.Read(junk)
				conn.Write(junk)
			} else {
				auth.Handshake(conn, []byte("not the job secret"), auth.Dialer, 2*time.Second)
			}
			conn.Close()
		}
	}
	return made
}
