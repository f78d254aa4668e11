package launch

import (
	"strings"
	"testing"

	"github.com/kolo-dl/kolo/internal/launch/flags"
)

func TestNodeSlots(t *testing.T) {
	tests := []struct {
		o       flags.Options
		want    int
		wantErr string
	}{
		{flags.Options{NNodes: 2, NprocPerNode: 3, NP: 8}, 3, ""},
		{flags.Options{NNodes: 2, Hosts: "localhost:4"}, 4, ""},
		{flags.Options{NNodes: 2, NP: 8}, 4, ""},
		{flags.Options{NNodes: 3, NP: 8}, 0, "does not split evenly"},
		{flags.Options{NNodes: 2, Hosts: "otherhost:2"}, 0, "-H names this node only"},
		{flags.Options{NNodes: 2}, 0, "--nproc-per-node"},
	}
	for _, tc := range tests {
		got, err := nodeSlots(&tc.o)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%+v: error %v, want %q", tc.o, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%+v: %d, %v; want %d", tc.o, got, err, tc.want)
		}
	}
}
