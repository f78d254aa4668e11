package flags

import (
	"io"
	"reflect"
	"strings"
	"testing"
)

func TestParseLaunchModeFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		check   func(*Options) bool
		wantErr string
	}{
		{"ssh flags, horovodrun spellings", []string{"-p", "12345", "-i", "/k", "--ssh-option", "A=1", "--ssh-option", "B=2", "--network-interface", "eth0", "-H", "a:1", "prog"},
			func(o *Options) bool {
				return o.SSHPort == 12345 && o.SSHIdentityFile == "/k" && reflect.DeepEqual(o.SSHOptions, []string{"A=1", "B=2"}) &&
					o.NetworkInterface == "eth0" && o.Rendezvous == "" && o.NodeRank == -1
			}, ""},
		{"long ssh flags", []string{"--ssh-port", "2", "--ssh-identity-file", "/k2", "prog"},
			func(o *Options) bool { return o.SSHPort == 2 && o.SSHIdentityFile == "/k2" }, ""},
		{"no-ssh mode", []string{"--rendezvous", "node0:29400", "--nnodes", "3", "--node-rank", "2", "--nproc-per-node", "4", "--secret-file", "/s", "prog"},
			func(o *Options) bool {
				return o.Rendezvous == "node0:29400" && o.NNodes == 3 && o.NodeRank == 2 && o.NprocPerNode == 4 && o.SecretFile == "/s"
			}, ""},
		{"rendezvous without nnodes", []string{"--rendezvous", "h:1", "-np", "2", "prog"}, nil, "--nnodes"},
		{"rendezvous without port", []string{"--rendezvous", "h", "--nnodes", "2", "prog"}, nil, "HOST:PORT"},
		{"node rank out of range", []string{"--rendezvous", "h:1", "--nnodes", "2", "--node-rank", "2", "prog"}, nil, "outside 0..1"},
		{"nnodes without rendezvous", []string{"--nnodes", "2", "-np", "2", "prog"}, nil, "need --rendezvous"},
		{"hostfile with rendezvous", []string{"--rendezvous", "h:1", "--nnodes", "2", "--hostfile", "f", "prog"}, nil, "--hostfile cannot"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o, err := Parse(tc.args, io.Discard)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !tc.check(o) {
				t.Errorf("parsed %+v", o)
			}
		})
	}
}
