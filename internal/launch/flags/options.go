// Package flags is kolo run's command line: horovodrun-compatible flags (and --config-file, its
// YAML form) parsed into Options, checked for consistency before anything starts, and the
// tuning flags turned into the KOLO_* variables every worker gets. It must not start processes,
// reach the network or decide how a job runs: it says what was asked, and launch acts on it.
package flags

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/kolo-dl/kolo/internal/jobenv"
	"github.com/kolo-dl/kolo/internal/launch/elastic"
	"github.com/kolo-dl/kolo/internal/launch/layout"
	"github.com/kolo-dl/kolo/internal/settings"
)

// --bind-to values.
const (
	BindNone = "none"
	BindCore = "core"
	// BindCoreOverload is BindCore that, with more ranks than CPUs, binds them round robin
	// (cpuset.Overload), as mpirun's --bind-to core:overload-allowed. Parse turns it into
	// BindCore with BindOverload set.
	BindCoreOverload = "core:overload-allowed"
)

// Values of --status.
const (
	StatusAuto = "auto" // the live status lines when stdout is a terminal
	StatusOn   = "on"
	StatusOff  = "off"
)

// Options is what `kolo run` was asked to do, parsed from horovodrun-compatible flags.
type Options struct {
	// AfterOrphans is not a flag: the command the orphan guard runs once it has killed the ranks of
	// a launcher that died (cmd/kolo sets it to its own shm-sweep). Empty: nothing.
	AfterOrphans []string

	NP           int
	Hosts        string // -H
	Hostfile     string
	StartTimeout time.Duration
	OutputDir    string
	OutcomeFile  string // --outcome-file: where the job's outcome goes, as JSON; empty: nowhere
	Verbose      bool
	Timestamps   bool
	Env          []string          // -x NAME or NAME=VALUE
	EngineEnv    map[string]string // tuning flags translated to KOLO_* variables for workers
	Command      []string
	PlainOutput  bool // no rank prefixes on output lines (kolo bench)

	// The launcher's live view of the job (package observe), for the jobs whose rendezvous it
	// serves itself.
	Status      string // --status: StatusAuto, StatusOn or StatusOff
	MetricsAddr string // --metrics-addr HOST:PORT: serve Prometheus metrics there; empty: none

	// Flags that end kolo run before any launch, and settings of the launcher itself.
	CheckBuild bool   // -cb: print what this build of kolo supports
	Version    bool   // -v: print kolo's version
	LogLevel   string // --log-level, also passed to workers as KOLO_LOG_LEVEL

	// Ranks on other hosts over ssh (internal/launch/proc/ssh.go).
	SSHPort          int      // -p
	SSHIdentityFile  string   // -i
	SSHOptions       []string // --ssh-option, passed to ssh as -o
	NetworkInterface string   // --network-interface: what workers and the rendezvous advertise

	BindTo        string // --bind-to: BindNone or BindCore (internal/launch/proc/bind.go)
	BindOverload  bool   // --bind-to core:overload-allowed
	Oversubscribe bool   // --oversubscribe, or KOLO_OVERSUBSCRIBE=1

	// No ssh: every node runs kolo run and they meet at a rendezvous (internal/launch/node.go).
	Rendezvous   string // --rendezvous HOST:PORT
	NNodes       int    // --nnodes
	NodeRank     int    // --node-rank; -1: in order of arrival
	NprocPerNode int    // --nproc-per-node; 0: from -H localhost:N or -np / --nnodes
	SecretFile   string // --secret-file; else the environment's secret (auth.JobSecret)

	// Elastic mode (elasticjob.go), on when DiscoveryScript, MinNP or MaxNP is given: workers come
	// and go while the job runs, and the survivors keep running.
	MinNP             int              // --min-np, --min-num-proc; 0: -np
	MaxNP             int              // --max-np, --max-num-proc; 0: no limit (every slot discovered), as in Horovod
	DiscoveryScript   string           // --host-discovery-script: run with sh -c, prints host[:slots] lines
	SlotsPerHost      int              // --slots-per-host: slots of a discovered host listed without ":N"
	ResetLimit        int              // --reset-limit; -1 (the default): no limit
	BlacklistCooldown elastic.Cooldown // --blacklist-cooldown-range MIN MAX; zero: a failed host is out for good
	ElasticTimeout    time.Duration    // --elastic-timeout, else KOLO_ELASTIC_TIMEOUT, HOROVOD_ELASTIC_TIMEOUT, 600 s
}

// Elastic reports whether opts asks for elastic mode.
func (o *Options) Elastic() bool {
	return o.DiscoveryScript != "" || o.MinNP != 0 || o.MaxNP != 0
}

// multiFlag collects repeated flags (-x A -x B=1).
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(s string) error { *m = append(*m, s); return nil }

// Parse parses `kolo run` arguments. Parsing stops at the first non-flag argument: that and
// everything after it is the command, passed to workers untouched (so the script's own flags are
// never interpreted here).
func Parse(args []string, stderr io.Writer) (*Options, error) {
	o := &Options{EngineEnv: map[string]string{}}
	fs := flag.NewFlagSet("kolo run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&o.NP, "np", 0, "number of ranks (processes) to start")
	fs.IntVar(&o.NP, "num-proc", 0, "same as -np")
	fs.StringVar(&o.Hosts, "H", "", "hosts and slots: host1:2,host2:4 (default localhost with -np slots)")
	fs.StringVar(&o.Hosts, "hosts", "", "same as -H")
	fs.StringVar(&o.Hostfile, "hostfile", "", "file of 'host slots=N' lines")
	o.StartTimeout = 30 * time.Second
	fs.Var((*seconds)(&o.StartTimeout), "start-timeout", "how long ranks may take to start and meet: seconds as horovodrun takes them (60), or a duration (90s, 2m)")
	fs.StringVar(&o.OutputDir, "output-filename", "", "also write each rank's output to DIR/rank.N/{stdout,stderr}")
	fs.StringVar(&o.OutcomeFile, "outcome-file", "", "when the job ends, write how it ended to FILE as one JSON document: exit code, the rank the failure traces back to and its failure record, how every rank ended (for programs: it replaces reading the summary on stderr)")
	fs.BoolVar(&o.Verbose, "verbose", false, "log what the launcher does")
	fs.StringVar(&o.Status, "status", StatusAuto, "live status lines under the ranks' output: auto (when stdout is a terminal), on, off")
	fs.StringVar(&o.MetricsAddr, "metrics-addr", "", "serve the job's metrics for Prometheus at http://HOST:PORT/metrics while it runs (a loopback HOST, 127.0.0.1, keeps them on this machine; port 0 picks one)")
	fs.BoolVar(&o.Timestamps, "prefix-output-with-timestamp", false, "prefix every output line with the time")
	fs.Var((*multiFlag)(&o.Env), "x", "forward an environment variable to workers: NAME or NAME=VALUE (repeatable)")

	fs.IntVar(&o.SSHPort, "p", 0, "ssh port of the other hosts (default: ssh's config, else 22)")
	fs.IntVar(&o.SSHPort, "ssh-port", 0, "same as -p")
	fs.StringVar(&o.SSHIdentityFile, "i", "", "ssh private key for the other hosts")
	fs.StringVar(&o.SSHIdentityFile, "ssh-identity-file", "", "same as -i")
	fs.Var((*multiFlag)(&o.SSHOptions), "ssh-option", "pass -o OPTION to ssh, e.g. StrictHostKeyChecking=accept-new (repeatable)")
	fs.StringVar(&o.NetworkInterface, "network-interface", "", "interface(s) whose address workers and the rendezvous use, e.g. eth0 or ib0,eth0 (the first present on a host); workers get KOLO_NETWORK_INTERFACE")
	fs.StringVar(&o.BindTo, "bind-to", BindNone, "core: bind each rank to cores of its own, this machine's CPUs split evenly among its ranks, whole cores first (as mpirun --bind-to core; torch's default thread count then follows); core:overload-allowed: the same, and with more ranks than CPUs each rank gets one CPU, round robin; none: no binding")
	fs.BoolVar(&o.Oversubscribe, "oversubscribe", false, "start more ranks than this machine has CPUs, in a job without -H or --hostfile (as mpirun's --oversubscribe; also KOLO_OVERSUBSCRIBE=1); refused otherwise")
	fs.StringVar(&o.Rendezvous, "rendezvous", "", "no-ssh mode: every node runs kolo run with the same HOST:PORT and --nnodes; the node that owns HOST (or --node-rank 0) serves the rendezvous there; the job secret comes from --secret-file, else KOLO_SECRET, else KOLO_SECRET_FILE")
	fs.IntVar(&o.NNodes, "nnodes", 0, "no-ssh mode: how many nodes (kolo run processes) the job has; in elastic mode, how many the first round waits for (default 1), more may join later")
	fs.IntVar(&o.NodeRank, "node-rank", -1, "no-ssh mode: this node's index in 0..nnodes-1, orders the ranks (give it on every node or on none; default: order of arrival)")
	fs.IntVar(&o.NprocPerNode, "nproc-per-node", 0, "no-ssh mode: ranks this node runs (default: N of -H localhost:N, else -np divided by --nnodes)")
	fs.StringVar(&o.SecretFile, "secret-file", "", "no-ssh mode: file holding the job secret shared by every node (default: KOLO_SECRET, else the file KOLO_SECRET_FILE names)")

	fs.IntVar(&o.MinNP, "min-np", 0, "elastic mode: fewest ranks the job runs with (default -np)")
	fs.IntVar(&o.MinNP, "min-num-proc", 0, "same as --min-np")
	fs.IntVar(&o.MaxNP, "max-np", 0, "elastic mode: most ranks the job runs with (default: no limit, every slot the hosts have)")
	fs.IntVar(&o.MaxNP, "max-num-proc", 0, "same as --max-np")
	fs.StringVar(&o.DiscoveryScript, "host-discovery-script", "", "elastic mode: command (run with sh -c every second) printing the hosts available now, one host or host:slots a line (not with --rendezvous, where the nodes that join are the hosts)")
	fs.IntVar(&o.SlotsPerHost, "slots-per-host", 0, "elastic mode: slots of a discovered host listed without :slots")
	fs.IntVar(&o.ResetLimit, "reset-limit", -1, "elastic mode: how many times the job may change its workers (default: no limit)")
	var cooldown cooldownFlag
	fs.Var(&cooldown, "blacklist-cooldown-range", "elastic mode: MIN MAX (or MIN,MAX) seconds a failed host stays out, doubling from MIN up to MAX with each failure (default: out for good)")
	fs.Var((*seconds)(&o.ElasticTimeout), "elastic-timeout", "elastic mode: seconds the job may wait for enough slots before it fails (default KOLO_ELASTIC_TIMEOUT, else HOROVOD_ELASTIC_TIMEOUT, else 600)")

	// Tuning, timeline, autotune and log flags become KOLO_* variables of every worker (workerflags.go).
	addWorkerFlags(fs, o.EngineEnv)
	fs.Var(configFileFlag{fs: fs}, "config-file",
		"YAML file with horovodrun's sections params, autotune, timeline, stall_check, logging; flags after it override it, flags before it are overridden")
	fs.BoolVar(&o.CheckBuild, "cb", false, "print the frameworks, controllers and tensor operations this build of kolo supports, and exit")
	fs.BoolVar(&o.CheckBuild, "check-build", false, "same as -cb")
	fs.BoolVar(&o.Version, "v", false, "print kolo's version and exit")
	fs.BoolVar(&o.Version, "version", false, "same as -v")

	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	// --blacklist-cooldown-range takes two words, as horovodrun's does: flag stopped at the second
	// one, so take it and parse the rest.
	for cooldown.wantMax() && fs.NArg() > 0 && isInteger(fs.Arg(0)) {
		cooldown.max = fs.Arg(0)
		if err := fs.Parse(fs.Args()[1:]); err != nil {
			return nil, err
		}
	}
	o.Command = fs.Args()
	o.LogLevel = o.EngineEnv[jobenv.LogLevel]
	if o.CheckBuild || o.Version {
		return o, nil
	}
	var npErr error
	fs.Visit(func(f *flag.Flag) {
		if (f.Name == "np" || f.Name == "num-proc") && o.NP <= 0 {
			npErr = fmt.Errorf("-%s %s: must be a positive integer (the number of ranks to start)", f.Name, f.Value)
		}
	})
	if o.BindTo == BindCoreOverload {
		o.BindTo, o.BindOverload = BindCore, true
	}
	metricsHost, _, metricsErr := net.SplitHostPort(o.MetricsAddr)
	switch {
	case npErr != nil:
		return nil, npErr
	case len(o.Command) == 0:
		return nil, errors.New("no command given: kolo run -np N COMMAND [ARGS...]")
	case o.Hosts != "" && o.Hostfile != "":
		return nil, errors.New("-H and --hostfile are mutually exclusive")
	case o.BindTo != BindNone && o.BindTo != BindCore:
		return nil, fmt.Errorf("--bind-to %q: want %s, %s or %s", o.BindTo, BindCore, BindCoreOverload, BindNone)
	case o.Status != StatusAuto && o.Status != StatusOn && o.Status != StatusOff:
		return nil, fmt.Errorf("--status %q: want %s, %s or %s", o.Status, StatusAuto, StatusOn, StatusOff)
	case o.MetricsAddr != "" && (metricsErr != nil || metricsHost == ""):
		return nil, fmt.Errorf("--metrics-addr %q: want HOST:PORT with a host (127.0.0.1:9400 serves this machine only)", o.MetricsAddr)
	}
	for _, check := range []func() error{o.checkOutcomeFile, o.checkNodeFlags, func() error { return o.checkElasticFlags(fs, &cooldown) }} {
		if err := check(); err != nil {
			return nil, err
		}
	}
	var err error
	if o.Oversubscribe, err = Oversubscribing(o.Oversubscribe); err != nil {
		return nil, err
	}
	return o, nil
}

// Oversubscribing is whether a job may start more local ranks than CPUs: the --oversubscribe flag,
// else KOLO_OVERSUBSCRIBE in this process's environment (kolo run's and kolo bench's).
func Oversubscribing(flag bool) (bool, error) {
	if flag {
		return true, nil
	}
	on, err := settings.Oversubscribe.Switch(os.Getenv)
	if errors.Is(err, settings.ErrUnset) {
		return false, nil
	}
	return on, err
}

// ResolveHosts returns the hosts of the job: -H, --hostfile, or localhost with np slots.
func (o *Options) ResolveHosts() ([]layout.Host, error) {
	switch {
	case o.Hosts != "":
		return layout.ParseHosts(o.Hosts)
	case o.Hostfile != "":
		return layout.ReadHostfile(o.Hostfile)
	}
	if o.NP <= 0 {
		return nil, errors.New("-np is required (the number of ranks to start)")
	}
	return []layout.Host{{Name: "localhost", Slots: o.NP}}, nil
}

// checkOutcomeFile refuses an --outcome-file that cannot be written when the job ends: one whose
// directory is missing, or a directory. A job that ran for hours must not lose its outcome to a
// typo found at its end.
func (o *Options) checkOutcomeFile() error {
	if o.OutcomeFile == "" {
		return nil
	}
	if fi, err := os.Stat(o.OutcomeFile); err == nil && fi.IsDir() {
		return fmt.Errorf("--outcome-file %s is a directory: want a file name", o.OutcomeFile)
	}
	if fi, err := os.Stat(filepath.Dir(o.OutcomeFile)); err != nil || !fi.IsDir() {
		return fmt.Errorf("--outcome-file %s: its directory %s does not exist", o.OutcomeFile, filepath.Dir(o.OutcomeFile))
	}
	return nil
}

// checkNodeFlags checks the no-ssh flags for consistency; the rest is checked once the nodes meet.
func (o *Options) checkNodeFlags() error {
	if o.Rendezvous == "" {
		if o.NNodes != 0 || o.NodeRank >= 0 || o.NprocPerNode != 0 || o.SecretFile != "" {
			return errors.New("--nnodes, --node-rank, --nproc-per-node and --secret-file need --rendezvous HOST:PORT")
		}
		return nil
	}
	if _, _, err := net.SplitHostPort(o.Rendezvous); err != nil {
		return fmt.Errorf("--rendezvous %q: want HOST:PORT: %w", o.Rendezvous, err)
	}
	// Elastic: nodes come and go, --nnodes is how many the first round waits for (default 1), and
	// ranks are the planner's, round by round.
	switch el := o.Elastic(); {
	case el && o.NNodes < 0:
		return fmt.Errorf("--nnodes %d must be positive", o.NNodes)
	case el && o.NodeRank >= 0:
		return errors.New("--node-rank has no meaning in elastic mode: nodes join in any order, and each round numbers the ranks anew")
	case o.NNodes < 1 && !el:
		return errors.New("--rendezvous needs --nnodes N (how many nodes run kolo run for this job)")
	case o.NodeRank >= o.NNodes && !el:
		return fmt.Errorf("--node-rank %d is outside 0..%d (--nnodes %d)", o.NodeRank, o.NNodes-1, o.NNodes)
	case o.Hostfile != "":
		return errors.New("--hostfile cannot be used with --rendezvous: each node runs its own ranks (-H localhost:N or --nproc-per-node N)")
	case o.NprocPerNode < 0:
		return fmt.Errorf("--nproc-per-node %d must be positive", o.NprocPerNode)
	}
	return nil
}

// checkElasticFlags fills in elastic mode's defaults and refuses what it cannot do.
func (o *Options) checkElasticFlags(fs *flag.FlagSet, cooldown *cooldownFlag) error {
	var err error
	if o.BlacklistCooldown, err = cooldown.value(); err != nil {
		return err
	}
	if !o.Elastic() {
		var set []string
		fs.Visit(func(f *flag.Flag) {
			switch f.Name {
			case "slots-per-host", "reset-limit", "blacklist-cooldown-range", "elastic-timeout":
				set = append(set, "--"+f.Name)
			}
		})
		if len(set) > 0 {
			return fmt.Errorf("%s only apply to elastic mode (--host-discovery-script, --min-np or --max-np)", strings.Join(set, ", "))
		}
		return nil
	}
	switch {
	case o.Rendezvous != "" && o.DiscoveryScript != "":
		return errors.New("--host-discovery-script cannot be used with --rendezvous: without ssh, the hosts of an elastic job are the nodes that join the rendezvous (each node runs kolo run)")
	case o.BindTo == BindCore:
		return errors.New("--bind-to core is not available in elastic mode: the ranks of a host change while the job runs")
	case o.DiscoveryScript != "" && (o.Hosts != "" || o.Hostfile != ""):
		return errors.New("--host-discovery-script and -H/--hostfile are mutually exclusive: the script lists the hosts")
	case o.SlotsPerHost < 0:
		return fmt.Errorf("--slots-per-host %d must be positive", o.SlotsPerHost)
	case o.ResetLimit < -1:
		return fmt.Errorf("--reset-limit %d must be 0 or more", o.ResetLimit)
	case o.NP < 0 || o.MinNP < 0 || o.MaxNP < 0:
		return fmt.Errorf("-np %d, --min-np %d, --max-np %d: none may be negative", o.NP, o.MinNP, o.MaxNP)
	case o.NP > 0 && o.MinNP > o.NP:
		// Checked here too: the planner, taking --max-np from -np, would blame --max-np.
		return fmt.Errorf("--min-np %d is above -np %d (the ranks the job starts with)", o.MinNP, o.NP)
	case o.MaxNP > 0 && o.NP > o.MaxNP:
		return fmt.Errorf("-np %d is above --max-np %d", o.NP, o.MaxNP)
	}
	if o.ElasticTimeout == 0 {
		if o.ElasticTimeout, err = jobenv.ElasticTimeoutFrom(jobenv.FromEnviron(os.Environ())); err != nil {
			return err
		}
	}
	_, err = elastic.NewPlanner(o.ElasticConfig())
	return err
}

// ElasticNodeFlags are, in a canonical form, the elastic flags every node of a no-ssh elastic job
// must agree on: the serving node refuses a node whose flags differ. The elastic timeout and
// --nnodes are the serving node's alone.
func (o *Options) ElasticNodeFlags() string {
	return fmt.Sprintf("-np %d --min-np %d --max-np %d --reset-limit %d --blacklist-cooldown-range %d,%d",
		o.NP, o.MinNP, o.MaxNP, o.ResetLimit, int(o.BlacklistCooldown.Min.Seconds()), int(o.BlacklistCooldown.Max.Seconds()))
}

// ElasticConfig is the planner's configuration of an elastic job.
func (o *Options) ElasticConfig() elastic.Config {
	return elastic.Config{
		NP: o.NP, MinNP: o.MinNP, MaxNP: o.MaxNP,
		Timeout:    o.ElasticTimeout,
		ResetLimit: o.ResetLimit,
		Cooldown:   o.BlacklistCooldown,
		Jitter:     rand.Float64,
	}
}

// cooldownFlag is --blacklist-cooldown-range: "MIN,MAX", or MIN with MAX as the next word
// (horovodrun's two arguments), whole seconds.
type cooldownFlag struct {
	min, max string
	comma    bool
}

func (c *cooldownFlag) String() string { return c.min + "," + c.max }

func (c *cooldownFlag) Set(s string) error {
	c.min, c.max, c.comma = strings.Cut(s, ",")
	return nil
}

// wantMax reports whether MAX is still to come as the next word.
func (c *cooldownFlag) wantMax() bool { return c.min != "" && !c.comma && c.max == "" }

func (c *cooldownFlag) value() (elastic.Cooldown, error) {
	if c.min == "" && c.max == "" {
		return elastic.Cooldown{}, nil
	}
	if c.wantMax() {
		return elastic.Cooldown{}, fmt.Errorf("--blacklist-cooldown-range %s: want two numbers of seconds, MIN MAX (or MIN,MAX)", c.min)
	}
	lo, err1 := strconv.Atoi(strings.TrimSpace(c.min))
	hi, err2 := strconv.Atoi(strings.TrimSpace(c.max))
	if err1 != nil || err2 != nil || lo <= 0 || hi < lo {
		return elastic.Cooldown{}, fmt.Errorf("--blacklist-cooldown-range %s %s: want whole seconds, 0 < MIN <= MAX", c.min, c.max)
	}
	return elastic.Cooldown{Min: time.Duration(lo) * time.Second, Max: time.Duration(hi) * time.Second}, nil
}

func isInteger(s string) bool {
	_, err := strconv.Atoi(s)
	return err == nil
}
