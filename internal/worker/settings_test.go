package worker

import (
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/engine"
	"github.com/kolo-dl/kolo/internal/world"
)

// The shared-memory waits follow the engine's Spin only when it was given (KOLO_SPIN_TIME, or a
// Config that sets it): engine.DefaultConfig leaves it unset, and a worker given that Config must
// leave shared memory its own default rather than turn its spinning off.
func TestSpinSettings(t *testing.T) {
	fromEnv := func(env map[string]string) engine.Config {
		t.Helper()
		cfg, err := engine.ConfigFromEnv(func(k string) string { return env[k] })
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	const local = 1
	for _, tc := range []struct {
		name     string
		cfg      engine.Config
		shm      time.Duration // world.Options.ShmSpin before
		spin     time.Duration // the engine's Spin after
		wantShm  time.Duration // ShmSpin after
		wantYlds int
	}{
		{"DefaultConfig", engine.DefaultConfig(), 0, engine.DefaultSpin(local), 0, engine.DefaultYields(local)},
		{"no KOLO_SPIN_TIME", fromEnv(nil), 0, engine.DefaultSpin(local), 0, engine.DefaultYields(local)},
		{"KOLO_SPIN_TIME=20", fromEnv(map[string]string{"KOLO_SPIN_TIME": "20"}), 0, 20 * time.Microsecond, 20 * time.Microsecond, 0},
		{"KOLO_SPIN_TIME=0", fromEnv(map[string]string{"KOLO_SPIN_TIME": "0"}), 0, 0, -1, 0},
		{"ShmSpin set wins", fromEnv(map[string]string{"KOLO_SPIN_TIME": "20"}), 7 * time.Microsecond, 20 * time.Microsecond, 7 * time.Microsecond, 0},
		{"ShmSpin kept when Spin unset", engine.DefaultConfig(), 7 * time.Microsecond, engine.DefaultSpin(local), 7 * time.Microsecond, engine.DefaultYields(local)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, w := spinSettings(tc.cfg, world.Options{ShmSpin: tc.shm}, local)
			if cfg.Spin != tc.spin || cfg.Yields != tc.wantYlds || w.ShmSpin != tc.wantShm {
				t.Errorf("Spin %v, Yields %d, ShmSpin %v; want %v, %d, %v", cfg.Spin, cfg.Yields, w.ShmSpin, tc.spin, tc.wantYlds, tc.wantShm)
			}
		})
	}
}

func TestShareCPUs(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	cases := []struct {
		hostCPUs, localSize, before, want int
	}{
		{2, 2, 2, 1},   // 2 ranks on 2 CPUs: one each
		{16, 2, 16, 8}, // a big host
		{16, 3, 16, 5}, // rounds down
		{2, 4, 2, 1},   // oversubscribed: still 1
		{64, 1, 2, 2},  // never above what the runtime chose (a bound rank's own CPUs)
		{4, 0, 4, 4},   // a local size the job never has: no division by zero
	}
	for _, tc := range cases {
		t.Setenv("KOLO_HOST_CPUS", strconv.Itoa(tc.hostCPUs))
		runtime.GOMAXPROCS(tc.before)
		shareCPUs(tc.localSize)
		if got := runtime.GOMAXPROCS(0); got != tc.want {
			t.Errorf("host CPUs %d, %d local ranks, GOMAXPROCS %d before: %d after, want %d",
				tc.hostCPUs, tc.localSize, tc.before, got, tc.want)
		}
	}
}
