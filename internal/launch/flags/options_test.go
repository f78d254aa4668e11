package flags

import (
	"io"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/launch/elastic"
	"github.com/kolo-dl/kolo/internal/launch/layout"
)

func TestParse(t *testing.T) {
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
		{"np 0", []string{"-np", "0", "prog"}, nil, "-np 0: must be a positive integer"},
		{"np -1", []string{"-np", "-1", "prog"}, nil, "-np -1: must be a positive integer"},
		{"num-proc 0", []string{"--num-proc", "0", "prog"}, nil, "-num-proc 0: must be a positive integer"},
		{"bind-to core", []string{"-np", "2", "--bind-to", "core", "prog"},
			func(o *Options) bool { return o.BindTo == BindCore }, ""},
		{"bind-to default", []string{"-np", "2", "prog"}, func(o *Options) bool { return o.BindTo == BindNone }, ""},
		{"bind-to core:overload-allowed", []string{"-np", "2", "--bind-to", "core:overload-allowed", "prog"},
			func(o *Options) bool { return o.BindTo == BindCore && o.BindOverload }, ""},
		{"bind-to unknown", []string{"-np", "2", "--bind-to", "socket", "prog"}, nil, `--bind-to "socket": want core, core:overload-allowed or none`},
		{"status and metrics default", []string{"-np", "2", "prog"}, func(o *Options) bool { return o.Status == StatusAuto && o.MetricsAddr == "" }, ""},
		{"status off, metrics on loopback", []string{"-np", "2", "--status", "off", "--metrics-addr", "127.0.0.1:9400", "prog"},
			func(o *Options) bool { return o.Status == StatusOff && o.MetricsAddr == "127.0.0.1:9400" }, ""},
		{"status unknown", []string{"-np", "2", "--status", "yes", "prog"}, nil, `--status "yes": want auto, on or off`},
		{"metrics-addr without a host", []string{"-np", "2", "--metrics-addr", ":9400", "prog"}, nil, `--metrics-addr ":9400": want HOST:PORT with a host`},
		{"metrics-addr without a port", []string{"-np", "2", "--metrics-addr", "127.0.0.1", "prog"}, nil, `--metrics-addr "127.0.0.1": want HOST:PORT`},
		{"outcome file in a directory that exists", []string{"-np", "2", "--outcome-file", os.TempDir() + "/kolo-outcome.json", "prog"},
			func(o *Options) bool { return o.OutcomeFile == os.TempDir()+"/kolo-outcome.json" }, ""},
		{"outcome file in the current directory", []string{"-np", "2", "--outcome-file", "outcome.json", "prog"},
			func(o *Options) bool { return o.OutcomeFile == "outcome.json" }, ""},
		{"outcome file in a missing directory", []string{"-np", "2", "--outcome-file", "/nonexistent-kolo-dir/o.json", "prog"}, nil, "its directory /nonexistent-kolo-dir does not exist"},
		{"outcome file a directory", []string{"-np", "2", "--outcome-file", os.TempDir(), "prog"}, nil, "is a directory"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o, err := Parse(tc.args, io.Discard)
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
	if err != nil || !reflect.DeepEqual(hosts, []layout.Host{{Name: "localhost", Slots: 3}}) {
		t.Errorf("default hosts = %v, %v", hosts, err)
	}
	if _, err := (&Options{}).ResolveHosts(); err == nil || !strings.Contains(err.Error(), "-np is required") {
		t.Errorf("no -np: %v", err)
	}
	if _, err := (&Options{Hostfile: "/nonexistent/hosts"}).ResolveHosts(); err == nil || !strings.Contains(err.Error(), "/nonexistent/hosts") {
		t.Errorf("missing hostfile: %v", err)
	}
}

func TestParseElasticFlags(t *testing.T) {
	t.Setenv("KOLO_ELASTIC_TIMEOUT", "")
	t.Setenv("HOROVOD_ELASTIC_TIMEOUT", "")
	tests := []struct {
		name    string
		env     string // HOROVOD_ELASTIC_TIMEOUT
		args    []string
		check   func(*Options) bool
		wantErr string
	}{
		{"not elastic", "", []string{"-np", "2", "prog"},
			func(o *Options) bool { return !o.Elastic() && o.ResetLimit == -1 }, ""},
		{"horovodrun's elastic flags", "", []string{"-np", "4", "--min-np", "2", "--max-np", "8", "--host-discovery-script", "./discover.sh",
			"--slots-per-host", "2", "--reset-limit", "3", "--blacklist-cooldown-range", "10", "100", "--elastic-timeout", "60", "python", "train.py", "7"},
			func(o *Options) bool {
				return o.Elastic() && o.NP == 4 && o.MinNP == 2 && o.MaxNP == 8 && o.DiscoveryScript == "./discover.sh" &&
					o.SlotsPerHost == 2 && o.ResetLimit == 3 && o.ElasticTimeout == time.Minute &&
					o.BlacklistCooldown == elastic.Cooldown{Min: 10 * time.Second, Max: 100 * time.Second} &&
					reflect.DeepEqual(o.Command, []string{"python", "train.py", "7"})
			}, ""},
		{"long spellings", "", []string{"--num-proc", "2", "--min-num-proc", "1", "--max-num-proc", "3", "-H", "localhost:2,127.0.0.1:2", "prog"},
			func(o *Options) bool { return o.Elastic() && o.MinNP == 1 && o.MaxNP == 3 && o.ResetLimit == -1 }, ""},
		{"flags after the cooldown's two words", "", []string{"--min-np", "2", "--blacklist-cooldown-range", "1", "5", "-H", "a:2", "prog"},
			func(o *Options) bool {
				return o.Hosts == "a:2" && o.BlacklistCooldown.Max == 5*time.Second && reflect.DeepEqual(o.Command, []string{"prog"})
			}, ""},
		{"cooldown MIN,MAX", "", []string{"--min-np", "2", "--blacklist-cooldown-range", "3,9", "prog"},
			func(o *Options) bool {
				return o.BlacklistCooldown == elastic.Cooldown{Min: 3 * time.Second, Max: 9 * time.Second}
			}, ""},
		{"cooldown without MAX", "", []string{"--min-np", "2", "--blacklist-cooldown-range", "3", "prog"}, nil, "want two numbers of seconds, MIN MAX"},
		{"cooldown MAX below MIN", "", []string{"--min-np", "2", "--blacklist-cooldown-range", "9", "3", "prog"}, nil, "0 < MIN <= MAX"},
		{"cooldown not a number", "", []string{"--min-np", "2", "--blacklist-cooldown-range", "a,b", "prog"}, nil, "want whole seconds"},
		{"timeout from HOROVOD_ELASTIC_TIMEOUT", "42", []string{"--min-np", "1", "prog"},
			func(o *Options) bool { return o.ElasticTimeout == 42*time.Second }, ""},
		{"the flag beats the environment", "42", []string{"--min-np", "1", "--elastic-timeout", "2m", "prog"},
			func(o *Options) bool { return o.ElasticTimeout == 2*time.Minute }, ""},
		{"timeout default", "", []string{"--min-np", "1", "prog"},
			func(o *Options) bool { return o.ElasticTimeout == 600*time.Second }, ""},
		{"bad timeout in the environment", "soon", []string{"--min-np", "1", "prog"}, nil, "HOROVOD_ELASTIC_TIMEOUT"},
		{"min-np above np", "", []string{"-np", "2", "--min-np", "3", "prog"}, nil, "--min-np 3 is above -np 2"},
		{"np above max-np", "", []string{"-np", "5", "--max-np", "4", "prog"}, nil, "-np 5 is above --max-np 4"},
		{"max-np below min-np", "", []string{"--min-np", "3", "--max-np", "2", "prog"}, nil, "--max-np 2 is below --min-np 3"},
		{"no np at all", "", []string{"--host-discovery-script", "d.sh", "prog"}, nil, "-np or --min-np must be at least 1"},
		{"with --rendezvous", "", []string{"--min-np", "2", "--rendezvous", "h:1", "--nnodes", "2", "--nproc-per-node", "2", "prog"},
			func(o *Options) bool { return o.Elastic() && o.Rendezvous == "h:1" && o.NNodes == 2 }, ""},
		{"with --rendezvous, no --nnodes", "", []string{"--min-np", "2", "--rendezvous", "h:1", "prog"},
			func(o *Options) bool { return o.Elastic() && o.NNodes == 0 }, ""},
		{"--rendezvous and a script", "", []string{"--min-np", "2", "--rendezvous", "h:1", "--host-discovery-script", "d.sh", "prog"}, nil,
			"the hosts of an elastic job are the nodes that join"},
		{"--rendezvous and --node-rank", "", []string{"--min-np", "2", "--rendezvous", "h:1", "--nnodes", "2", "--node-rank", "0", "prog"}, nil,
			"--node-rank has no meaning in elastic mode"},
		{"with --bind-to core", "", []string{"--min-np", "2", "--bind-to", "core", "prog"}, nil, "--bind-to core is not available in elastic mode"},
		{"with --bind-to core, no ssh", "", []string{"--min-np", "2", "--rendezvous", "h:1", "--nproc-per-node", "2", "--bind-to", "core", "prog"}, nil,
			"--bind-to core is not available in elastic mode"},
		{"script and -H", "", []string{"--min-np", "2", "--host-discovery-script", "d.sh", "-H", "a:2", "prog"}, nil, "mutually exclusive"},
		{"script and hostfile", "", []string{"--min-np", "2", "--host-discovery-script", "d.sh", "--hostfile", "f", "prog"}, nil, "mutually exclusive"},
		{"negative reset limit", "", []string{"--min-np", "2", "--reset-limit", "-2", "prog"}, nil, "--reset-limit -2"},
		{"elastic-only flag without elastic mode", "", []string{"-np", "2", "--slots-per-host", "2", "--reset-limit", "1", "prog"}, nil,
			"--reset-limit, --slots-per-host only apply to elastic mode"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("HOROVOD_ELASTIC_TIMEOUT", tc.env)
			o, err := Parse(tc.args, io.Discard)
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

// Horovod's own elastic tests run a job on "localhost" and "127.0.0.1" as two hosts.
func TestElasticLocalhostAnd127AreTwoHosts(t *testing.T) {
	o, err := Parse([]string{"--min-np", "2", "--max-np", "4", "-H", "localhost:2,127.0.0.1:2", "prog"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	hosts, err := o.ResolveHosts()
	if err != nil || !reflect.DeepEqual(hosts, []layout.Host{{Name: "localhost", Slots: 2}, {Name: "127.0.0.1", Slots: 2}}) {
		t.Fatalf("hosts %v, %v", hosts, err)
	}
}
