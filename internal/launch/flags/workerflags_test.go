package flags

import (
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/settings"
)

func writeConfig(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "hvd.yaml")
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// A config file in horovodrun's layout, every key kolo takes.
const fullConfig = `# horovodrun --config-file layout
params:
  fusion_threshold_mb: 32
  cycle_time_ms: 2.5
  cache_capacity: 512
  hierarchical_allreduce: false
  hierarchical_allgather: true
autotune:
  enabled: yes
  log_file: /tmp/autotune.csv
  warmup_samples: 3
  steps_per_sample: 10
  bayes_opt_max_samples: 20
  gaussian_process_noise: 0.8
timeline:
  filename: /tmp/timeline.json
  mark_cycles: true
stall_check:
  enabled: false
  warning_time_seconds: 30
  shutdown_time_seconds: 120
  progress_timeout_seconds: 90
logging:
  level: DEBUG
`

func TestWorkerFlags(t *testing.T) {
	full := writeConfig(t, fullConfig)
	tests := []struct {
		name string
		args []string
		want map[string]string // variables that must have these values
		none []string          // variables that must be absent
		err  string
	}{
		{"nothing set: workers get the engine's defaults", []string{"prog"}, map[string]string{},
			[]string{"KOLO_FUSION_THRESHOLD", "KOLO_HIERARCHICAL_ALLREDUCE", "KOLO_STALL_CHECK_DISABLE", "KOLO_LOG_LEVEL", settings.Autotune.Name}, ""},
		{"tuning flags", []string{"--fusion-threshold-mb", "32", "--cycle-time-ms", "2.5", "--cache-capacity", "0",
			"--no-stall-check", "--stall-check-warning-time-seconds", "5", "--stall-check-shutdown-time-seconds", "30",
			"--stall-check-crossed-time-seconds", "2.5", "--progress-timeout-seconds", "7.5", "prog"},
			map[string]string{"KOLO_FUSION_THRESHOLD": "33554432", "KOLO_CYCLE_TIME": "2.5ms", "KOLO_CACHE_CAPACITY": "0",
				"KOLO_STALL_CHECK_DISABLE": "1", "KOLO_STALL_CHECK_TIME_SECONDS": "5", "KOLO_STALL_SHUTDOWN_TIME_SECONDS": "30",
				"KOLO_STALL_CROSSED_TIME_SECONDS": "2.5", "KOLO_PROGRESS_TIMEOUT_SECONDS": "7.5"}, nil, ""},
		{"hierarchical on, then off: last wins", []string{"--hierarchical-allreduce", "--no-hierarchical-allreduce", "prog"},
			map[string]string{"KOLO_HIERARCHICAL_ALLREDUCE": "0"}, nil, ""},
		{"hierarchical=false", []string{"--hierarchical-allreduce=false", "prog"},
			map[string]string{"KOLO_HIERARCHICAL_ALLREDUCE": "0"}, nil, ""},
		{"timeline and autotune", []string{"--timeline-filename", "/tmp/t.json", "--timeline-mark-cycles", "--autotune",
			"--autotune-log-file", "at.csv", "--autotune-warmup-samples", "3", "--autotune-steps-per-sample", "10",
			"--autotune-bayes-opt-max-samples", "20", "--autotune-gaussian-process-noise", "0.8", "prog"},
			map[string]string{settings.Timeline.Name: "/tmp/t.json", settings.TimelineMarkCycles.Name: "1", settings.Autotune.Name: "1", settings.AutotuneLog.Name: "at.csv",
				settings.AutotuneWarmupSamples.Name: "3", settings.AutotuneStepsPerSample.Name: "10", settings.AutotuneMaxSamples.Name: "20", settings.AutotuneNoise.Name: "0.8"}, nil, ""},
		{"log level", []string{"--log-level", "WARNING", "prog"}, map[string]string{"KOLO_LOG_LEVEL": "WARNING"}, nil, ""},
		{"bad log level", []string{"--log-level", "LOUD", "prog"}, nil, nil, "TRACE, DEBUG"},
		{"negative fusion", []string{"--fusion-threshold-mb", "-1", "prog"}, nil, nil, "want a number >= 0"},
		{"noise above 1", []string{"--autotune-gaussian-process-noise", "1.5", "prog"}, nil, nil, "[0, 1]"},
		{"bad cache", []string{"--cache-capacity", "many", "prog"}, nil, nil, "want an integer >= 0"},

		{"config file", []string{"--config-file", full, "prog"},
			map[string]string{"KOLO_FUSION_THRESHOLD": "33554432", "KOLO_CYCLE_TIME": "2.5ms", "KOLO_CACHE_CAPACITY": "512",
				"KOLO_HIERARCHICAL_ALLREDUCE": "0", settings.HierarchicalAllgather.Name: "1", settings.Autotune.Name: "1", settings.AutotuneLog.Name: "/tmp/autotune.csv",
				settings.AutotuneWarmupSamples.Name: "3", settings.AutotuneStepsPerSample.Name: "10", settings.AutotuneMaxSamples.Name: "20", settings.AutotuneNoise.Name: "0.8",
				settings.Timeline.Name: "/tmp/timeline.json", settings.TimelineMarkCycles.Name: "1", "KOLO_STALL_CHECK_DISABLE": "1",
				"KOLO_STALL_CHECK_TIME_SECONDS": "30", "KOLO_STALL_SHUTDOWN_TIME_SECONDS": "120", "KOLO_PROGRESS_TIMEOUT_SECONDS": "90",
				"KOLO_LOG_LEVEL": "DEBUG"}, nil, ""},
		{"flags after the config file win", []string{"--config-file", full, "--fusion-threshold-mb", "1", "--log-level", "ERROR", "prog"},
			map[string]string{"KOLO_FUSION_THRESHOLD": "1048576", "KOLO_LOG_LEVEL": "ERROR", "KOLO_CACHE_CAPACITY": "512"}, nil, ""},
		{"flags before the config file lose", []string{"--fusion-threshold-mb", "1", "--no-stall-check=false", "--config-file", full, "prog"},
			map[string]string{"KOLO_FUSION_THRESHOLD": "33554432", "KOLO_STALL_CHECK_DISABLE": "1"}, nil, ""},
		{"missing config file", []string{"--config-file", "/nonexistent/hvd.yaml", "prog"}, nil, nil, "/nonexistent/hvd.yaml"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o, err := Parse(tc.args, io.Discard)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range tc.want {
				if o.EngineEnv[k] != v {
					t.Errorf("%s = %q, want %q (all: %v)", k, o.EngineEnv[k], v, o.EngineEnv)
				}
			}
			for _, k := range tc.none {
				if v, ok := o.EngineEnv[k]; ok {
					t.Errorf("%s = %q, want it unset", k, v)
				}
			}
			if !reflect.DeepEqual(o.Command, []string{"prog"}) {
				t.Errorf("command %v", o.Command)
			}
		})
	}
}

func TestParseConfigErrors(t *testing.T) {
	tests := []struct {
		name, text, err string
	}{
		{"unknown section", "params:\n  cache_capacity: 1\nnetwork:\n  x: 1\n", `hvd.yaml:3: unknown key "network"`},
		{"unknown key names the section", "params:\n  fusion_treshold_mb: 1\n", `hvd.yaml:2: unknown key "params.fusion_treshold_mb"`},
		{"horovod-only section", "library_options:\n  num_nccl_streams: 2\n", `hvd.yaml:1: "library_options" is not a kolo setting: configures MPI`},
		{"horovod controller", "controller: gloo\n", `"controller" is not a kolo setting`},
		{"not a map", "- a\n- b\n", "hvd.yaml:1: want a map of sections"},
		{"section not a map", "params: 3\n", `hvd.yaml:1: section "params": want a map`},
		{"value not a scalar", "params:\n  cache_capacity: [1, 2]\n", "hvd.yaml:2: params.cache_capacity: want a single value"},
		{"stall enabled not bool", "stall_check:\n  enabled: maybe\n", "hvd.yaml:2: stall_check.enabled: want true or false"},
		{"bad yaml", "params:\n  a: [\n", "hvd.yaml"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig("hvd.yaml", []byte(tc.text))
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("err = %v, want %q", err, tc.err)
			}
		})
	}
	// A value of the wrong type is reported with the file, line and key by the flag it sets.
	p := writeConfig(t, "params:\n  cycle_time_ms: soon\n")
	_, err := Parse([]string{"--config-file", p, "prog"}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), p+":2: params.cycle_time_ms: want a number") {
		t.Errorf("bad value: %v", err)
	}
	// Empty sections and an empty file set nothing.
	for _, text := range []string{"", "params:\n", "# only a comment\n"} {
		if s, err := ParseConfig("hvd.yaml", []byte(text)); err != nil || len(s) != 0 {
			t.Errorf("ParseConfig(%q) = %v, %v", text, s, err)
		}
	}
}

func TestEarlyExitFlags(t *testing.T) {
	for _, args := range [][]string{{"-cb"}, {"--check-build"}, {"-v"}, {"--version"}} {
		o, err := Parse(args, io.Discard)
		if err != nil || !(o.CheckBuild || o.Version) {
			t.Errorf("%v: %+v, %v (no command is needed)", args, o, err)
		}
	}
	// The script's own -v is the script's.
	o, err := Parse([]string{"-np", "2", "python", "train.py", "-v"}, io.Discard)
	if err != nil || o.Version || !reflect.DeepEqual(o.Command, []string{"python", "train.py", "-v"}) {
		t.Errorf("script's -v: %+v, %v", o, err)
	}
}

// Every flag appears in --help, and the ones kolo accepts without acting on them say so.
func TestHelpListsHorovodsFlags(t *testing.T) {
	var b strings.Builder
	Parse([]string{"-h"}, &b)
	help := b.String()
	for _, f := range []string{"-autotune", "-autotune-gaussian-process-noise", "-config-file", "-log-level", "-cb", "-check-build",
		"-timeline-filename", "-timeline-mark-cycles", "-hierarchical-allgather", "-x", "-v"} {
		if !strings.Contains(help, "  "+f+" ") && !strings.Contains(help, "  "+f+"\n") && !strings.Contains(help, "  "+f+"\t") {
			t.Errorf("--help lacks %s", f)
		}
	}
	if strings.Contains(help, "not implemented") {
		t.Errorf("--help says something is not implemented; every flag it lists works:\n%s", help)
	}
	if strings.Count(help, "autotune") < 6 {
		t.Errorf("the autotune flags do not say what they do:\n%s", help)
	}
}

func TestStartTimeout(t *testing.T) {
	for arg, want := range map[string]time.Duration{"60": time.Minute, "2.5": 2500 * time.Millisecond, "90s": 90 * time.Second, "2m": 2 * time.Minute} {
		o, err := Parse([]string{"--start-timeout", arg, "prog"}, io.Discard)
		if err != nil || o.StartTimeout != want {
			t.Errorf("--start-timeout %s: %v, %v", arg, o, err)
		}
	}
	if o, _ := Parse([]string{"prog"}, io.Discard); o.StartTimeout != 30*time.Second {
		t.Errorf("default start timeout %v", o.StartTimeout)
	}
	if _, err := Parse([]string{"--start-timeout", "0", "prog"}, io.Discard); err == nil {
		t.Error("--start-timeout 0 accepted")
	}
}
