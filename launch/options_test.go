package launch

import (
	"io"
	"reflect"
	"strings"
	"testing"
)

func TestParseRunFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		check   func(*Options) bool
		wantErr string
	}{
		{"np and script args untouched", []string{"-np", "4", "python", "train.py", "-np", "9", "--lr", "0.1"},
			func(o *Options) bool {
				return o.NP == 4 && reflect.DeepEqual(o.Command, []string{"python", "train.py", "-np", "9", "--lr", "0.1"})
			}, ""},
		{"horovodrun spellings", []string{"--num-proc", "2", "-H", "a:1,b:1", "-x", "FOO", "-x", "BAR=1", "prog"},
			func(o *Options) bool {
				return o.NP == 2 && o.Hosts == "a:1,b:1" && reflect.DeepEqual(o.Env, []string{"FOO", "BAR=1"})
			}, ""},
		{"tuning flags become engine env", []string{"-np", "1", "--fusion-threshold-mb", "32", "--cycle-time-ms", "2.5",
			"--cache-capacity", "0", "--no-stall-check", "--stall-check-shutdown-time-seconds", "30", "prog"},
			func(o *Options) bool {
				return o.EngineEnv["KOLO_FUSION_THRESHOLD"] == "33554432" && o.EngineEnv["KOLO_CYCLE_TIME"] == "2.5ms" &&
					o.EngineEnv["KOLO_CACHE_CAPACITY"] == "0" && o.EngineEnv["KOLO_STALL_CHECK_DISABLE"] == "1" &&
					o.EngineEnv["KOLO_STALL_SHUTDOWN_TIME_SECONDS"] == "30"
			}, ""},
		{"no command", []string{"-np", "2"}, nil, "no command given"},
		{"H and hostfile", []string{"-H", "a:1", "--hostfile", "f", "prog"}, nil, "mutually exclusive"},
		{"unknown flag", []string{"--bogus", "prog"}, nil, "bogus"},
		{"bad np", []string{"-np", "two", "prog"}, nil, "invalid value"},
		{"bind-to core", []string{"-np", "2", "--bind-to", "core", "prog"},
			func(o *Options) bool { return o.BindTo == BindCore }, ""},
		{"bind-to default", []string{"-np", "2", "prog"}, func(o *Options) bool { return o.BindTo == BindNone }, ""},
		{"bind-to unknown", []string{"-np", "2", "--bind-to", "socket", "prog"}, nil, `--bind-to "socket": want core or none`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o, err := ParseRunFlags(tc.args, io.Discard)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || !tc.check(o) {
				t.Fatalf("options %+v, err %v", o, err)
			}
		})
	}
}

func TestResolveHosts(t *testing.T) {
	o := &Options{NP: 3}
	hosts, err := o.ResolveHosts()
	if err != nil || !reflect.DeepEqual(hosts, []Host{{"localhost", 3}}) {
		t.Errorf("default hosts = %v, %v", hosts, err)
	}
	if _, err := (&Options{}).ResolveHosts(); err == nil || !strings.Contains(err.Error(), "-np is required") {
		t.Errorf("no -np: %v", err)
	}
	if _, err := (&Options{Hostfile: "/nonexistent/hosts"}).ResolveHosts(); err == nil || !strings.Contains(err.Error(), "/nonexistent/hosts") {
		t.Errorf("missing hostfile: %v", err)
	}
}
