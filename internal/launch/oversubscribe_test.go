package launch

import (
	"context"
	"io"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/jobenv"
	"github.com/kolo-dl/kolo/internal/launch/flags"
)

func TestCheckOversubscribe(t *testing.T) {
	const cpus = 4
	tests := []struct {
		name  string
		o     flags.Options
		local int
		want  string // "": accepted
	}{
		{"as many as CPUs", flags.Options{}, 4, ""},
		{"one", flags.Options{}, 1, ""},
		{"one too many", flags.Options{}, 5, "-np 5: more ranks than the 4 CPUs of this machine; give --oversubscribe (or KOLO_OVERSUBSCRIBE=1) to start them anyway"},
		{"a typo", flags.Options{}, 999, "-np 999: more ranks than the 4 CPUs"},
		{"asked for", flags.Options{Oversubscribe: true}, 999, ""},
		{"--bind-to core checks its own split", flags.Options{BindTo: flags.BindCore}, 8, ""},
	}
	for _, tc := range tests {
		err := checkOversubscribe(&tc.o, tc.local, "-np", cpus)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v, want accepted", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want an error with %q", tc.name, err, tc.want)
		}
	}
	for _, tc := range []struct {
		o    flags.Options
		n    int
		flag string
	}{
		{flags.Options{NP: 3}, 3, "-np"},
		{flags.Options{NP: 2, MinNP: 3}, 3, "--min-np"},
		{flags.Options{NP: 2, MinNP: 1, MaxNP: 8}, 8, "--max-np"},
	} {
		if n, flag := elasticLocalRanks(&tc.o); n != tc.n || flag != tc.flag {
			t.Errorf("elasticLocalRanks(%+v) = %d %s, want %d %s", tc.o, n, flag, tc.n, tc.flag)
		}
	}
}

// kolo run -np CPUS+1 on this machine alone is refused before anything starts; with -H, or asked
// for, it starts.
func TestOversubscribedJobRefused(t *testing.T) {
	over := strconv.Itoa(runtime.NumCPU() + 1)
	tests := []struct {
		name    string
		env     string
		args    []string
		refused bool
	}{
		{"local", "", []string{"-np", over}, true},
		{"local elastic", "", []string{"-np", "1", "--min-np", "1", "--max-np", over}, true},
		{"--oversubscribe", "", []string{"-np", over, "--oversubscribe"}, false},
		{"KOLO_OVERSUBSCRIBE=1", "1", []string{"-np", over}, false},
		{"slots listed", "", []string{"-np", over, "-H", "localhost:" + over}, false},
		{"within the CPUs", "", []string{"-np", "1"}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(jobenv.Oversubscribe, tc.env)
			o, err := flags.Parse(append(tc.args, "true"), io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			run := RunHosts
			if o.Elastic() {
				run = RunElastic
			}
			code, err := run(ctx, o, io.Discard, io.Discard)
			if tc.refused {
				if code != ExitUsage || err == nil || !strings.Contains(err.Error(), "more ranks than the") || !strings.Contains(err.Error(), "--oversubscribe") {
					t.Fatalf("exit %d, %v; want a usage error naming the numbers and --oversubscribe", code, err)
				}
				return
			}
			if code != 0 || err != nil {
				t.Fatalf("exit %d, %v; want the job to run", code, err)
			}
		})
	}
}
