package engine

import (
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/collective"
	"github.com/kolo-dl/kolo/internal/settings"
)

func TestConfigFromEnv(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		want func(Config) bool
		err  string
	}{
		{"defaults", nil, func(c Config) bool { return c.FusionBytes == 128<<20 && c.CacheCapacity == 1024 && c.StallCheck }, ""},
		{"kolo bytes", map[string]string{"KOLO_FUSION_THRESHOLD": "64MiB"}, func(c Config) bool { return c.FusionBytes == 64<<20 }, ""},
		{"fusion off", map[string]string{"HOROVOD_FUSION_THRESHOLD": "0"}, func(c Config) bool { return c.FusionBytes < 0 }, ""},
		{"horovod plain", map[string]string{"HOROVOD_FUSION_THRESHOLD": "1048576"}, func(c Config) bool { return c.FusionBytes == 1<<20 }, ""},
		{"kolo wins", map[string]string{"KOLO_CACHE_CAPACITY": "5", "HOROVOD_CACHE_CAPACITY": "9"}, func(c Config) bool { return c.CacheCapacity == 5 }, ""},
		{"cycle ms", map[string]string{"HOROVOD_CYCLE_TIME": "2.5"}, func(c Config) bool { return c.CycleTime == 2500*time.Microsecond }, ""},
		{"stall", map[string]string{"KOLO_STALL_CHECK_TIME_SECONDS": "5", "KOLO_STALL_SHUTDOWN_TIME_SECONDS": "20s"},
			func(c Config) bool { return c.StallWarning == 5*time.Second && c.StallShutdown == 20*time.Second }, ""},
		{"stall disable", map[string]string{"HOROVOD_STALL_CHECK_DISABLE": "1"}, func(c Config) bool { return !c.StallCheck }, ""},
		{"timeline", map[string]string{"HOROVOD_TIMELINE": "/tmp/t.json", "HOROVOD_TIMELINE_MARK_CYCLES": "1"},
			func(c Config) bool { return c.Timeline == "/tmp/t.json" && c.TimelineMarkCycles }, ""},
		{"kolo timeline wins", map[string]string{"KOLO_TIMELINE": "/a.json", "HOROVOD_TIMELINE": "/b.json"},
			func(c Config) bool { return c.Timeline == "/a.json" && !c.TimelineMarkCycles }, ""},
		{"spin unset", nil, func(c Config) bool { return c.Spin < 0 }, ""},
		{"spin us", map[string]string{"KOLO_SPIN_TIME": "20"}, func(c Config) bool { return c.Spin == 20*time.Microsecond }, ""},
		{"plain slot stores", map[string]string{"KOLO_SHM_STREAM_STORES": "0"}, func(c Config) bool { return c.SlotStores == collective.SlotStoresPlain }, ""},
		{"streaming slot stores", map[string]string{"KOLO_SHM_STREAM_STORES": "1"}, func(c Config) bool { return c.SlotStores == collective.SlotStoresStreaming }, ""},
		{"measured slot stores", map[string]string{"KOLO_SHM_STREAM_STORES": "auto"}, func(c Config) bool { return c.SlotStores == collective.SlotStoresAuto }, ""},
		{"bad slot stores", map[string]string{"KOLO_SHM_STREAM_STORES": "sometimes"}, nil, "want 1 (streaming stores), 0 (plain) or auto"},
		{"spin off", map[string]string{"HOROVOD_SPIN_TIME": "0"}, func(c Config) bool { return c.Spin == 0 }, ""},
		{"collective knobs", map[string]string{"KOLO_SMALL_ALLREDUCE_BYTES": "16KiB", "KOLO_SHM_ROUND_BYTES": "4MiB"},
			func(c Config) bool { return c.SmallAllreduceBytes == 16<<10 && c.SharedRoundBytes == 4<<20 }, ""},
		{"bad shm round", map[string]string{"KOLO_SHM_ROUND_BYTES": "big"}, nil, "KOLO_SHM_ROUND_BYTES"},
		{"progress default", nil, func(c Config) bool { return c.ProgressTimeout == 60*time.Second }, ""},
		{"progress seconds", map[string]string{"KOLO_PROGRESS_TIMEOUT_SECONDS": "2.5"},
			func(c Config) bool { return c.ProgressTimeout == 2500*time.Millisecond }, ""},
		{"progress off", map[string]string{"KOLO_PROGRESS_TIMEOUT_SECONDS": "0"}, func(c Config) bool { return c.ProgressTimeout < 0 }, ""},
		{"bad progress", map[string]string{"KOLO_PROGRESS_TIMEOUT_SECONDS": "soon"}, nil, "KOLO_PROGRESS_TIMEOUT_SECONDS"},
		{"bad bool", map[string]string{"KOLO_TIMELINE_MARK_CYCLES": "often"}, nil, "KOLO_TIMELINE_MARK_CYCLES"},
		{"bad bytes", map[string]string{"KOLO_FUSION_THRESHOLD": "lots"}, nil, `KOLO_FUSION_THRESHOLD="lots"`},
		{"bad int", map[string]string{"HOROVOD_CACHE_CAPACITY": "-3"}, nil, "HOROVOD_CACHE_CAPACITY"},
		{"autotune off", nil, func(c Config) bool { return c.Autotune == AutotuneConfig{} }, ""},
		{"autotune horovod", map[string]string{"HOROVOD_AUTOTUNE": "1", "HOROVOD_AUTOTUNE_LOG": "at.csv",
			"HOROVOD_AUTOTUNE_WARMUP_SAMPLES": "2", "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": "5",
			"HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "30", "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE": "0.5"},
			func(c Config) bool {
				return c.Autotune == AutotuneConfig{Enabled: true, LogFile: "at.csv", WarmupSamples: 2, StepsPerSample: 5, MaxSamples: 30, Noise: 0.5}
			}, ""},
		{"autotune kolo wins", map[string]string{"KOLO_AUTOTUNE": "0", "HOROVOD_AUTOTUNE": "1"}, func(c Config) bool { return !c.Autotune.Enabled }, ""},
		{"bad autotune noise", map[string]string{"KOLO_AUTOTUNE_GAUSSIAN_PROCESS_NOISE": "2"}, nil, "KOLO_AUTOTUNE_GAUSSIAN_PROCESS_NOISE"},
		{"bad autotune samples", map[string]string{"KOLO_AUTOTUNE_STEPS_PER_SAMPLE": "ten"}, nil, "KOLO_AUTOTUNE_STEPS_PER_SAMPLE"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ConfigFromEnv(func(k string) string { return tc.env[k] })
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || !tc.want(c) {
				t.Fatalf("config %+v, err %v", c, err)
			}
		})
	}
}

// Yielding instead of sleeping is the default only where ranks outnumber cores, as not spinning is.
func TestDefaultYieldsFollowsOversubscription(t *testing.T) {
	cpus := runtime.NumCPU()
	if got := DefaultYields(cpus); got != 0 {
		t.Errorf("DefaultYields(%d) on %d CPUs = %d, want 0", cpus, cpus, got)
	}
	if got := DefaultYields(cpus + 1); got <= 0 {
		t.Errorf("DefaultYields(%d) on %d CPUs = %d, want > 0", cpus+1, cpus, got)
	}
	if DefaultSpin(cpus+1) != 0 {
		t.Errorf("DefaultSpin(%d) on %d CPUs = %v, want 0 (yields replace spinning)", cpus+1, cpus, DefaultSpin(cpus+1))
	}
}

// The defaults the settings' declarations show (the README's table) are the engine's.
func TestDefaultsAsDeclared(t *testing.T) {
	def := DefaultConfig()
	for _, tc := range []struct {
		s    *settings.Setting
		want int64
	}{
		{settings.FusionThreshold, def.FusionBytes},
		{settings.CycleTime, int64(def.CycleTime)},
		{settings.CacheCapacity, int64(def.CacheCapacity)},
		{settings.StallCheckTime, int64(def.StallWarning)},
		{settings.StallShutdownTime, int64(def.StallShutdown)},
		{settings.StallCrossedTime, int64(def.StallCrossed)},
		{settings.ProgressTimeout, int64(def.ProgressTimeout)},
		{settings.StartTimeout, int64(def.SetupTimeout)},
		{settings.SmallAllreduceBytes, collective.DefaultSmallAllreduceBytes},
		{settings.ShmRoundBytes, collective.DefaultSharedRoundBytes},
	} {
		declared := func(k string) string {
			if k == tc.s.Name {
				return tc.s.Default
			}
			return ""
		}
		var got int64
		var err error
		switch tc.s.Kind {
		case settings.Bytes:
			got, err = tc.s.Bytes(declared)
		case settings.Count:
			var n int
			n, err = tc.s.Count(declared)
			got = int64(n)
		case settings.Duration:
			var d time.Duration
			d, err = tc.s.Duration(declared)
			got = int64(d)
		}
		if err != nil || got != tc.want {
			t.Errorf("%s: declared default %q reads as %d (%v); the engine's is %d", tc.s.Name, tc.s.Default, got, err, tc.want)
		}
	}
}
