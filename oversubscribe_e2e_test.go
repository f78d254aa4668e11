package kolo_test

import (
	"fmt"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/jobenv"
)

// kolo run -np 999 on this machine alone is refused before any rank starts, naming the numbers and
// the flag; --oversubscribe (or KOLO_OVERSUBSCRIBE=1) starts them; -np within the CPUs is untouched.
func TestOversubscription(t *testing.T) {
	kolo := buildKolo(t)
	cpus := runtime.NumCPU()
	over := strconv.Itoa(cpus + 1)
	tests := []struct {
		name    string
		env     string
		args    []string
		refused string // the message, "" when the job runs
	}{
		{"-np 999", "0", []string{"-np", "999"}, fmt.Sprintf("kolo run: -np 999: more ranks than the %d CPUs of this machine; give --oversubscribe (or KOLO_OVERSUBSCRIBE=1)", cpus)},
		{"one too many", "0", []string{"-np", over}, fmt.Sprintf("-np %s: more ranks than the %d CPUs", over, cpus)},
		{"--oversubscribe", "0", []string{"-np", over, "--oversubscribe"}, ""},
		{"KOLO_OVERSUBSCRIBE=1", "1", []string{"-np", over}, ""},
		{"within the CPUs", "0", []string{"-np", strconv.Itoa(min(cpus, 2))}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			argv := append(append([]string{kolo, "run"}, tc.args...), "/bin/sh", "-c", `touch "$0/rank.$KOLO_RANK"`, dir)
			l := startLauncher(t, launchEnv(jobenv.Oversubscribe+"="+tc.env), argv...)
			code := l.wait(t, time.Minute)
			started, _ := filepath.Glob(filepath.Join(dir, "rank.*"))
			if tc.refused != "" {
				if code != 2 || !strings.Contains(l.stderr.String(), tc.refused) {
					t.Errorf("exit %d, want 2 and %q\n%s", code, tc.refused, l.output())
				}
				if len(started) > 0 {
					t.Errorf("%d ranks started before the refusal", len(started))
				}
				return
			}
			np, _ := strconv.Atoi(tc.args[1])
			if code != 0 || len(started) != np {
				t.Errorf("exit %d with %d of %d ranks started, want all and 0\n%s", code, len(started), np, l.output())
			}
		})
	}
}
