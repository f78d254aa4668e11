package flags

import (
	"flag"
	"fmt"
	"strconv"
	"time"

	"github.com/kolo-dl/kolo/internal/jobenv"
	"github.com/kolo-dl/kolo/internal/settings"
)

// envFlag is a flag whose value, once checked, becomes one environment variable of every worker.
// Setting it again (a later flag, or --config-file) overwrites the variable, so the last one wins.
type envFlag struct {
	dst    map[string]string
	env    string
	isBool bool
	conv   func(string) (string, error) // the flag's text -> the variable's value
	text   string
}

func (f *envFlag) String() string   { return f.text }
func (f *envFlag) IsBoolFlag() bool { return f.isBool }
func (f *envFlag) Set(s string) error {
	v, err := f.conv(s)
	if err != nil {
		return err
	}
	f.text = s
	f.dst[f.env] = v
	return nil
}

func nonNegFloat(scale float64, format string) func(string) (string, error) {
	return func(s string) (string, error) {
		v, err := strconv.ParseFloat(s, 64)
		if err != nil || v < 0 {
			return "", fmt.Errorf("want a number >= 0, got %q", s)
		}
		return fmt.Sprintf(format, v*scale), nil
	}
}

func nonNegInt(s string) (string, error) {
	v, err := strconv.Atoi(s)
	if err != nil || v < 0 {
		return "", fmt.Errorf("want an integer >= 0, got %q", s)
	}
	return strconv.Itoa(v), nil
}

func boolTo(yes, no string) func(string) (string, error) {
	return func(s string) (string, error) {
		b, err := strconv.ParseBool(s)
		if err != nil {
			return "", fmt.Errorf("want true or false, got %q", s)
		}
		if b {
			return yes, nil
		}
		return no, nil
	}
}

func anyString(s string) (string, error) { return s, nil }

func unitInterval(s string) (string, error) {
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || v < 0 || v > 1 {
		return "", fmt.Errorf("want a number in [0, 1], got %q", s)
	}
	return strconv.FormatFloat(v, 'g', -1, 64), nil
}

func logLevel(s string) (string, error) {
	if _, err := jobenv.ParseLogLevel(s); err != nil {
		return "", err
	}
	return s, nil
}

// addWorkerFlags registers the flags that configure the workers rather than the launch: engine
// tuning, stall check, timeline, autotune, log level. Each sets a variable in env.
func addWorkerFlags(fs *flag.FlagSet, env map[string]string) {
	add := func(name, variable string, isBool bool, conv func(string) (string, error), usage string) {
		fs.Var(&envFlag{dst: env, env: variable, isBool: isBool, conv: conv}, name, usage+" ["+variable+"]")
	}
	add("fusion-threshold-mb", settings.FusionThreshold.Name, false, nonNegFloat(1<<20, "%.0f"),
		"fuse ready tensors into buffers of up to this many MiB (default 128)")
	add("cycle-time-ms", settings.CycleTime.Name, false, nonNegFloat(1, "%gms"),
		"wait this long to gather more ready tensors before negotiating (default 0: at once)")
	add("cache-capacity", settings.CacheCapacity.Name, false, nonNegInt,
		"response cache entries; 0 disables the cache (default 1024)")
	add("hierarchical-allreduce", settings.HierarchicalAllreduce.Name, true, boolTo("1", "0"),
		"two-level allreduce: shared memory within a host, TCP across hosts (default on where every host runs the same number of ranks)")
	add("no-hierarchical-allreduce", settings.HierarchicalAllreduce.Name, true, boolTo("0", "1"),
		"flat allreduce across all ranks")
	add("hierarchical-allgather", settings.HierarchicalAllgather.Name, true, boolTo("1", "0"),
		"accepted for horovodrun compatibility: kolo's allgather has no hierarchical variant yet")
	add("no-hierarchical-allgather", settings.HierarchicalAllgather.Name, true, boolTo("0", "1"),
		"accepted for horovodrun compatibility (see --hierarchical-allgather)")
	add("no-stall-check", settings.StallCheckDisable.Name, true, boolTo("1", "0"),
		"do not report ops that some ranks submitted and others did not")
	add("stall-check-warning-time-seconds", settings.StallCheckTime.Name, false, nonNegFloat(1, "%g"),
		"report an op some ranks have not submitted after this many seconds (default 60)")
	add("stall-check-shutdown-time-seconds", settings.StallShutdownTime.Name, false, nonNegFloat(1, "%g"),
		"fail such an op after this many seconds (default 1800; 0: never)")
	add("stall-check-crossed-time-seconds", settings.StallCrossedTime.Name, false, nonNegFloat(1, "%g"),
		"fail sooner an op whose missing ranks wait on other ops of their own: calls that went different ways on different ranks (default 30; 0: never)")
	add("progress-timeout-seconds", settings.ProgressTimeout.Name, false, nonNegFloat(1, "%g"),
		"fail a collective on every rank, and stop the job, when a rank waits this many seconds inside it on a peer that moves no byte (stopped, hung, cut off), naming that peer (default 60; 0: never)")
	add("timeline-filename", settings.Timeline.Name, false, anyString,
		"record a timeline of the job's ops (Chrome trace format) in this file")
	add("timeline-mark-cycles", settings.TimelineMarkCycles.Name, true, boolTo("1", "0"),
		"mark the engine's cycles in the timeline")
	add("autotune", settings.Autotune.Name, true, boolTo("1", "0"),
		"tune the fusion threshold and cycle time while the job runs, keeping the defaults unless a candidate is faster with 95% confidence (docs/launcher.md)")
	add("autotune-log-file", settings.AutotuneLog.Name, false, anyString,
		"rank 0's CSV log of every autotune sample; a log that holds a decision is read back, so the next run starts tuned")
	add("autotune-warmup-samples", settings.AutotuneWarmupSamples.Name, false, nonNegInt,
		"autotune samples discarded at the start (default 3)")
	add("autotune-steps-per-sample", settings.AutotuneStepsPerSample.Name, false, nonNegInt,
		"optimizer steps per autotune sample (default: sized by time, at least 1 s and 5 steps, at most what still decides within 300 steps, 10 at the defaults)")
	add("autotune-bayes-opt-max-samples", settings.AutotuneMaxSamples.Name, false, nonNegInt,
		"measured autotune samples (the defaults' and candidates') before it must decide (default 20)")
	add("autotune-gaussian-process-noise", settings.AutotuneNoise.Name, false, unitInterval,
		"the autotuner's Gaussian-process noise, in [0, 1] (default 0.8)")
	add("log-level", jobenv.LogLevel, false, logLevel,
		"TRACE, DEBUG, INFO, WARNING, ERROR or FATAL: the launcher's and the workers' log level (default INFO)")
}

// seconds is a duration flag that also takes a bare number of seconds, as horovodrun's
// --start-timeout does.
type seconds time.Duration

func (d *seconds) String() string { return time.Duration(*d).String() }
func (d *seconds) Set(s string) error {
	if f, err := strconv.ParseFloat(s, 64); err == nil && f > 0 {
		*d = seconds(f * float64(time.Second))
		return nil
	}
	v, err := time.ParseDuration(s)
	if err != nil || v <= 0 {
		return fmt.Errorf("want seconds (60) or a duration (90s), got %q", s)
	}
	*d = seconds(v)
	return nil
}
