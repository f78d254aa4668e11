package engine

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/kolo-dl/kolo/collective"
	"github.com/kolo-dl/kolo/internal/spin"
	"github.com/kolo-dl/kolo/transport"
)

// Config holds the engine's knobs. Zero values mean the defaults (Horovod's where it has one).
type Config struct {
	FusionBytes   int64         // fuse ready tensors up to this many bytes; default 128 MiB; negative: never fuse
	CycleTime     time.Duration // how long to gather more ready tensors before negotiating; default 0 (negotiate at once)
	CacheCapacity int           // response cache entries; default 1024; 0 after defaults disables
	StallWarning  time.Duration // report ops some ranks have not submitted after this; default 60 s
	// StallShutdown fails an op some ranks have not submitted after this long; default 30 min (as
	// torch.distributed's timeout: a rank may legitimately compute, evaluate or checkpoint for
	// long while the others wait), negative for never (Horovod's default).
	StallShutdown time.Duration
	// StallCrossed fails, sooner, an op whose missing ranks wait on ops of their own that its
	// submitters lack, submitting nothing else: calls that went different ways on different
	// ranks, which nothing will reconcile (negotiate.Config.StallCrossed); default 30 s,
	// negative for never.
	StallCrossed time.Duration
	// ProgressTimeout is the progress deadline of every collective: a peer that moves no byte
	// (or does not reach a barrier) for this long, while this rank waits on it inside a
	// collective, fails the op and stops the job, on every rank, naming that peer. Default
	// transport.DefaultProgressTimeout (60 s), negative for never. The transports enforce it:
	// kolo.Init passes it to them (world.Options.ProgressTimeout); the engine uses it to bound how
	// long it gathers the other ranks' stall notices, and as the deadline of a rank waiting on
	// a coordinator (rank 0) that sends neither answers nor keep-alives (keepalive.go).
	ProgressTimeout time.Duration

	StallCheck   bool // the stall inspector (warnings and both deadlines); default true
	Hierarchical bool // two-level allreduce (shm within hosts, TCP across) where hosts run equal numbers of several ranks; default on; across hosts rank 0's counts
	// SlotStores is how the shared-memory collectives write their slots (KOLO_SHM_STREAM_STORES:
	// 1 streaming stores, 0 plain ones); the default measures both on the group's first one.
	SlotStores collective.SlotStores
	// SmallAllreduceBytes and SharedRoundBytes are collective.Tuning's knobs for every op of the
	// job (KOLO_SMALL_ALLREDUCE_BYTES, KOLO_SHM_ROUND_BYTES); 0: the collectives' defaults. Rank
	// 0's count: it sends them (and its Hierarchical) to every rank in a Retune ahead of the first
	// op, so a rank given others cannot run other algorithms. The autotuner may change them while
	// the job runs.
	SmallAllreduceBytes int64
	SharedRoundBytes    int64
	SetupTimeout        time.Duration // connecting to peers; default 60 s
	ShutdownWait        time.Duration // how long Shutdown waits for the other ranks; default 30 s
	// Spin is how long idle waits poll before parking; 0 = never. Negative, as in DefaultConfig,
	// means unset: kolo.Init picks DefaultSpin for the host (and leaves the shared-memory waits
	// their own default), New takes it as 0.
	Spin   time.Duration
	Yields int // when not polling, how many times a wait yields its CPU before parking (see DefaultYields)
	// Timeline, when set, is where rank 0 writes a Chrome trace from the start (see StartTimeline).
	Timeline           string
	TimelineMarkCycles bool

	// Device is the device path's backend (device.go); nil: GPU tensors are always staged.
	Device *DeviceBackend

	// Autotune, when Enabled, has rank 0 tune FusionBytes and CycleTime while the job runs, from
	// the time between the steps the program marks (MarkStep; the Python DistributedOptimizer
	// marks each step itself), and every rank apply its settings from the same step.
	Autotune AutotuneConfig
}

// AutotuneConfig is what kolo run's --autotune flags (and KOLO_AUTOTUNE*, HOROVOD_AUTOTUNE*) ask
// of the autotuner. Zero values are the autotune package's defaults.
type AutotuneConfig struct {
	Enabled        bool
	LogFile        string  // the CSV log rank 0 writes; one with a decision is read back: the job starts tuned
	WarmupSamples  int     // samples discarded at the start
	StepsPerSample int     // steps per sample
	MaxSamples     int     // measured samples before it must decide
	Noise          float64 // the Gaussian process's noise, in [0, 1]
	// Round is the elastic job's round this engine serves (1, 2, ...; 0 outside elastic jobs):
	// rank 0 of each round tunes for its own world and appends to the same log (kolo.Init sets
	// it, not the environment).
	Round int
}

// DefaultYields is how many times a driver that does not poll yields its CPU (sched_yield) before
// it sleeps on a host running localSize ranks: spin.DefaultYields when they outnumber its cores,
// else 0 (internal/spin has the rule and the measurements; the shared-memory transport follows it
// too).
func DefaultYields(localSize int) int {
	_, yields := spin.Defaults(localSize)
	return yields
}

// DefaultSpin is the idle-poll budget on a host running localSize ranks: spin.DefaultSpin when they
// do not outnumber its cores. When they do, polling only steals the core the awaited rank needs,
// so the default is 0.
func DefaultSpin(localSize int) time.Duration {
	d, _ := spin.Defaults(localSize)
	return d
}

// The stall deadlines' defaults (Config.StallShutdown, Config.StallCrossed).
const (
	DefaultStallShutdown = 30 * time.Minute
	DefaultStallCrossed  = 30 * time.Second
)

// DefaultConfig is what a job gets without any setting.
func DefaultConfig() Config {
	return Config{
		FusionBytes:   128 << 20,
		CacheCapacity: 1024,
		StallWarning:  60 * time.Second,
		StallShutdown: DefaultStallShutdown,
		StallCrossed:  DefaultStallCrossed,
		StallCheck:    true,
		Hierarchical:  true,
		SetupTimeout:  60 * time.Second,
		ShutdownWait:  30 * time.Second,
		Spin:          -1, // unset: kolo.Init picks DefaultSpin for the host and leaves the shared-memory waits theirs

		ProgressTimeout: transport.DefaultProgressTimeout,
	}
}

// ConfigFromEnv applies KOLO_* settings (and the HOROVOD_* spellings, which lose to KOLO_*) to
// DefaultConfig. Unparseable values are errors naming the variable, never silently ignored.
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	c := DefaultConfig()
	get := func(name string) (string, string) {
		for _, k := range []string{"KOLO_" + name, "HOROVOD_" + name} {
			if v := strings.TrimSpace(getenv(k)); v != "" {
				return k, v
			}
		}
		return "", ""
	}
	var errs []string
	bytesVar := func(name string, dst *int64) {
		if k, v := get(name); k != "" {
			n, err := parseBytes(v)
			if err != nil {
				errs = append(errs, fmt.Sprintf("%s=%q: %v", k, v, err))
				return
			}
			*dst = n
		}
	}
	intVar := func(name string, dst *int) {
		if k, v := get(name); k != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				errs = append(errs, fmt.Sprintf("%s=%q: want a non-negative integer", k, v))
				return
			}
			*dst = n
		}
	}
	// durVar accepts Go durations ("5ms") or a bare number in unit (Horovod's convention).
	durVar := func(name string, unit time.Duration, dst *time.Duration) {
		if k, v := get(name); k != "" {
			if f, err := strconv.ParseFloat(v, 64); err == nil && f >= 0 {
				*dst = time.Duration(f * float64(unit))
				return
			}
			d, err := time.ParseDuration(v)
			if err != nil || d < 0 {
				errs = append(errs, fmt.Sprintf("%s=%q: want a duration", k, v))
				return
			}
			*dst = d
		}
	}
	boolVar := func(name string, dst *bool) {
		if k, v := get(name); k != "" {
			b, err := strconv.ParseBool(v)
			if err != nil {
				errs = append(errs, fmt.Sprintf("%s=%q: want true/false/1/0", k, v))
				return
			}
			*dst = b
		}
	}
	bytesVar("FUSION_THRESHOLD", &c.FusionBytes)
	if c.FusionBytes == 0 {
		c.FusionBytes = -1 // HOROVOD_FUSION_THRESHOLD=0 turns fusion off, as in Horovod
	}
	durVar("CYCLE_TIME", time.Millisecond, &c.CycleTime)
	intVar("CACHE_CAPACITY", &c.CacheCapacity)
	durVar("STALL_CHECK_TIME_SECONDS", time.Second, &c.StallWarning)
	durVar("STALL_SHUTDOWN_TIME_SECONDS", time.Second, &c.StallShutdown)
	durVar("STALL_CROSSED_TIME_SECONDS", time.Second, &c.StallCrossed)
	// 0 turns a deadline off, as HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=0 does in Horovod.
	if c.StallShutdown == 0 {
		c.StallShutdown = -1
	}
	if c.StallCrossed == 0 {
		c.StallCrossed = -1
	}
	durVar("PROGRESS_TIMEOUT_SECONDS", time.Second, &c.ProgressTimeout)
	if c.ProgressTimeout == 0 {
		c.ProgressTimeout = -1
	}
	var disable bool
	boolVar("STALL_CHECK_DISABLE", &disable)
	c.StallCheck = !disable
	boolVar("HIERARCHICAL_ALLREDUCE", &c.Hierarchical)
	if k, v := get("SHM_STREAM_STORES"); k != "" {
		switch strings.ToLower(strings.TrimSpace(v)) {
		case "1", "true", "on":
			c.SlotStores = collective.SlotStoresStreaming
		case "0", "false", "off":
			c.SlotStores = collective.SlotStoresPlain
		case "", "auto":
			c.SlotStores = collective.SlotStoresAuto
		default:
			errs = append(errs, fmt.Sprintf("%s=%q: want 1 (streaming stores), 0 (plain) or auto", k, v))
		}
	}
	bytesVar("SMALL_ALLREDUCE_BYTES", &c.SmallAllreduceBytes)
	bytesVar("SHM_ROUND_BYTES", &c.SharedRoundBytes)
	durVar("START_TIMEOUT", time.Second, &c.SetupTimeout)
	durVar("SPIN_TIME", time.Microsecond, &c.Spin)
	if k, v := get("TIMELINE"); k != "" {
		c.Timeline = v
	}
	boolVar("TIMELINE_MARK_CYCLES", &c.TimelineMarkCycles)
	boolVar("AUTOTUNE", &c.Autotune.Enabled)
	if k, v := get("AUTOTUNE_LOG"); k != "" {
		c.Autotune.LogFile = v
	}
	intVar("AUTOTUNE_WARMUP_SAMPLES", &c.Autotune.WarmupSamples)
	intVar("AUTOTUNE_STEPS_PER_SAMPLE", &c.Autotune.StepsPerSample)
	intVar("AUTOTUNE_BAYES_OPT_MAX_SAMPLES", &c.Autotune.MaxSamples)
	if k, v := get("AUTOTUNE_GAUSSIAN_PROCESS_NOISE"); k != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f < 0 || f > 1 {
			errs = append(errs, fmt.Sprintf("%s=%q: want a number in [0, 1]", k, v))
		} else {
			c.Autotune.Noise = f
		}
	}
	if len(errs) > 0 {
		return c, fmt.Errorf("engine settings: %s", strings.Join(errs, "; "))
	}
	return c, nil
}

// parseBytes accepts plain byte counts and KiB/MiB/GiB (also K/M/G, KB/MB/GB as powers of 2).
func parseBytes(s string) (int64, error) {
	s = strings.TrimSpace(s)
	mult := int64(1)
	upper := strings.ToUpper(s)
	for _, u := range []struct {
		suffix string
		m      int64
	}{{"KIB", 1 << 10}, {"MIB", 1 << 20}, {"GIB", 1 << 30}, {"KB", 1 << 10}, {"MB", 1 << 20}, {"GB", 1 << 30}, {"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"B", 1}} {
		if strings.HasSuffix(upper, u.suffix) {
			mult = u.m
			s = strings.TrimSpace(s[:len(s)-len(u.suffix)])
			break
		}
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f < 0 {
		return 0, fmt.Errorf("want a byte count like 67108864 or 64MiB")
	}
	if b := f * float64(mult); b > maxSettingBytes {
		return 0, fmt.Errorf("%.4g bytes is more than kolo handles (%d, 1 TiB)", b, int64(maxSettingBytes))
	}
	return int64(f * float64(mult)), nil
}

// maxSettingBytes bounds a byte count a setting gives: no buffer kolo makes is larger.
const maxSettingBytes = 1 << 40

// ParseBytes is parseBytes for flags and benchmarks.
func ParseBytes(s string) (int64, error) { return parseBytes(s) }
