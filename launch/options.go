package launch

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"
)

// Options is what `kolo run` was asked to do, parsed from horovodrun-compatible flags.
type Options struct {
	NP           int
	Hosts        string // -H
	Hostfile     string
	StartTimeout time.Duration
	OutputDir    string
	Verbose      bool
	Timestamps   bool
	Env          []string          // -x NAME or NAME=VALUE
	EngineEnv    map[string]string // tuning flags translated to KOLO_* variables for workers
	Command      []string
	PlainOutput  bool // no rank prefixes on output lines (kolo bench)
}

// multiFlag collects repeated flags (-x A -x B=1).
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(s string) error { *m = append(*m, s); return nil }

// ParseRunFlags parses `kolo run` arguments. Parsing stops at the first non-flag argument: that and
// everything after it is the command, passed to workers untouched (so the script's own flags are
// never interpreted here).
func ParseRunFlags(args []string, stderr io.Writer) (*Options, error) {
	o := &Options{EngineEnv: map[string]string{}}
	fs := flag.NewFlagSet("kolo run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&o.NP, "np", 0, "number of ranks (processes) to start")
	fs.IntVar(&o.NP, "num-proc", 0, "same as -np")
	fs.StringVar(&o.Hosts, "H", "", "hosts and slots: host1:2,host2:4 (default localhost with -np slots)")
	fs.StringVar(&o.Hosts, "hosts", "", "same as -H")
	fs.StringVar(&o.Hostfile, "hostfile", "", "file of 'host slots=N' lines")
	fs.DurationVar(&o.StartTimeout, "start-timeout", 30*time.Second, "how long ranks may take to start and meet")
	fs.StringVar(&o.OutputDir, "output-filename", "", "also write each rank's output to DIR/rank.N/{stdout,stderr}")
	fs.BoolVar(&o.Verbose, "verbose", false, "log what the launcher does")
	fs.BoolVar(&o.Timestamps, "prefix-output-with-timestamp", false, "prefix every output line with the time")
	var env multiFlag
	fs.Var(&env, "x", "forward an environment variable to workers: NAME or NAME=VALUE (repeatable)")

	// Engine tuning flags map onto the KOLO_* variables the engine reads.
	fusionMB := fs.Float64("fusion-threshold-mb", -1, "fuse tensors up to this many MiB (default 128)")
	cycleMS := fs.Float64("cycle-time-ms", -1, "wait this long to batch ready tensors before negotiating (default 0)")
	cacheCap := fs.Int("cache-capacity", -1, "response cache entries (default 1024)")
	hier := fs.Bool("hierarchical-allreduce", false, "two-level allreduce: shared memory within a host, TCP across hosts (on by default where hosts run equal numbers of ranks; accepted for horovodrun compatibility; -x KOLO_HIERARCHICAL_ALLREDUCE=0 turns it off)")
	noStall := fs.Bool("no-stall-check", false, "disable the stall inspector")
	stallWarn := fs.Float64("stall-check-warning-time-seconds", -1, "report an op some ranks have not submitted after this many seconds (default 60)")
	stallStop := fs.Float64("stall-check-shutdown-time-seconds", -1, "fail such an op after this many seconds (default 0: never)")

	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	o.Env = env
	o.Command = fs.Args()
	if len(o.Command) == 0 {
		return nil, errors.New("no command given: kolo run -np N COMMAND [ARGS...]")
	}
	if o.Hosts != "" && o.Hostfile != "" {
		return nil, errors.New("-H and --hostfile are mutually exclusive")
	}
	if *fusionMB >= 0 {
		o.EngineEnv["KOLO_FUSION_THRESHOLD"] = fmt.Sprintf("%d", int64(*fusionMB*(1<<20)))
	}
	if *cycleMS >= 0 {
		o.EngineEnv["KOLO_CYCLE_TIME"] = fmt.Sprintf("%gms", *cycleMS)
	}
	if *cacheCap >= 0 {
		o.EngineEnv["KOLO_CACHE_CAPACITY"] = fmt.Sprintf("%d", *cacheCap)
	}
	if *hier {
		o.EngineEnv["KOLO_HIERARCHICAL_ALLREDUCE"] = "1"
	}
	if *noStall {
		o.EngineEnv["KOLO_STALL_CHECK_DISABLE"] = "1"
	}
	if *stallWarn >= 0 {
		o.EngineEnv["KOLO_STALL_CHECK_TIME_SECONDS"] = fmt.Sprintf("%g", *stallWarn)
	}
	if *stallStop >= 0 {
		o.EngineEnv["KOLO_STALL_SHUTDOWN_TIME_SECONDS"] = fmt.Sprintf("%g", *stallStop)
	}
	return o, nil
}

// ResolveHosts returns the hosts of the job: -H, --hostfile, or localhost with np slots.
func (o *Options) ResolveHosts() ([]Host, error) {
	switch {
	case o.Hosts != "":
		return ParseHosts(o.Hosts)
	case o.Hostfile != "":
		return ReadHostfile(o.Hostfile)
	}
	if o.NP <= 0 {
		return nil, errors.New("-np is required (the number of ranks to start)")
	}
	return []Host{{Name: "localhost", Slots: o.NP}}, nil
}
