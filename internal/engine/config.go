package engine

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/kolo-dl/kolo/internal/collective"
	"github.com/kolo-dl/kolo/internal/engine/negotiate"
	"github.com/kolo-dl/kolo/internal/settings"
	"github.com/kolo-dl/kolo/internal/spin"
	"github.com/kolo-dl/kolo/internal/transport"
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

// DefaultConfig is what a job gets without any setting: the negotiation's defaults where it has
// them, declared there once; settings' declarations show the same values (TestDefaultsAsDeclared).
func DefaultConfig() Config {
	return Config{
		FusionBytes:   negotiate.DefaultFusionBytes,
		CacheCapacity: negotiate.DefaultCacheCapacity,
		StallWarning:  negotiate.DefaultStallWarning,
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
// DefaultConfig, each read through its declaration in package settings. Unparseable values are
// errors naming the variable, never silently ignored.
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	c := DefaultConfig()
	var errs []string
	// keep stores a setting's value unless it is unset (the default stays) or malformed.
	keep := func(err error, set func()) {
		switch {
		case err == nil:
			set()
		case !errors.Is(err, settings.ErrUnset):
			errs = append(errs, err.Error())
		}
	}
	bytesVar := func(s *settings.Setting, dst *int64) {
		n, err := s.Bytes(getenv)
		keep(err, func() { *dst = n })
	}
	intVar := func(s *settings.Setting, dst *int) {
		n, err := s.Count(getenv)
		keep(err, func() { *dst = n })
	}
	durVar := func(s *settings.Setting, dst *time.Duration) {
		d, err := s.Duration(getenv)
		keep(err, func() { *dst = d })
	}
	boolVar := func(s *settings.Setting, dst *bool) {
		b, err := s.Bool(getenv)
		keep(err, func() { *dst = b })
	}
	bytesVar(settings.FusionThreshold, &c.FusionBytes)
	if c.FusionBytes == 0 {
		c.FusionBytes = -1 // HOROVOD_FUSION_THRESHOLD=0 turns fusion off, as in Horovod
	}
	durVar(settings.CycleTime, &c.CycleTime)
	intVar(settings.CacheCapacity, &c.CacheCapacity)
	durVar(settings.StallCheckTime, &c.StallWarning)
	durVar(settings.StallShutdownTime, &c.StallShutdown)
	durVar(settings.StallCrossedTime, &c.StallCrossed)
	// 0 turns a deadline off, as HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=0 does in Horovod.
	if c.StallShutdown == 0 {
		c.StallShutdown = -1
	}
	if c.StallCrossed == 0 {
		c.StallCrossed = -1
	}
	durVar(settings.ProgressTimeout, &c.ProgressTimeout)
	if c.ProgressTimeout == 0 {
		c.ProgressTimeout = -1
	}
	var disable bool
	boolVar(settings.StallCheckDisable, &disable)
	c.StallCheck = !disable
	boolVar(settings.HierarchicalAllreduce, &c.Hierarchical)
	if k, v, err := settings.ShmStreamStores.Choice(getenv); err == nil {
		switch v {
		case "1", "true", "on":
			c.SlotStores = collective.SlotStoresStreaming
		case "0", "false", "off":
			c.SlotStores = collective.SlotStoresPlain
		case "auto":
			c.SlotStores = collective.SlotStoresAuto
		}
	} else if !errors.Is(err, settings.ErrUnset) {
		errs = append(errs, fmt.Sprintf("%s=%q: want 1 (streaming stores), 0 (plain) or auto", k, v))
	}
	bytesVar(settings.SmallAllreduceBytes, &c.SmallAllreduceBytes)
	bytesVar(settings.ShmRoundBytes, &c.SharedRoundBytes)
	durVar(settings.StartTimeout, &c.SetupTimeout)
	durVar(settings.SpinTime, &c.Spin)
	if k, v := settings.Timeline.Lookup(getenv); k != "" {
		c.Timeline = v
	}
	boolVar(settings.TimelineMarkCycles, &c.TimelineMarkCycles)
	boolVar(settings.Autotune, &c.Autotune.Enabled)
	if k, v := settings.AutotuneLog.Lookup(getenv); k != "" {
		c.Autotune.LogFile = v
	}
	intVar(settings.AutotuneWarmupSamples, &c.Autotune.WarmupSamples)
	intVar(settings.AutotuneStepsPerSample, &c.Autotune.StepsPerSample)
	intVar(settings.AutotuneMaxSamples, &c.Autotune.MaxSamples)
	f, err := settings.AutotuneNoise.Fraction(getenv)
	keep(err, func() { c.Autotune.Noise = f })
	if len(errs) > 0 {
		return c, fmt.Errorf("engine settings: %s", strings.Join(errs, "; "))
	}
	return c, nil
}

// ParseBytes reads a byte count (settings.ParseBytes), for flags and benchmarks.
func ParseBytes(s string) (int64, error) { return settings.ParseBytes(s) }
