package flags

import (
	"strings"
	"testing"

	"github.com/kolo-dl/kolo/internal/jobenv"
)

// --oversubscribe or KOLO_OVERSUBSCRIBE allow oversubscription; a malformed KOLO_OVERSUBSCRIBE is
// refused with the variable's name.
func TestParseOversubscribe(t *testing.T) {
	tests := []struct {
		env  string
		args []string
		want bool
		err  string
	}{
		{"", []string{"-np", "100000", "true"}, false, ""},
		{"0", []string{"-np", "100000", "true"}, false, ""},
		{"1", []string{"-np", "100000", "true"}, true, ""},
		{"yes", []string{"-np", "100000", "true"}, true, ""},
		{"", []string{"-np", "100000", "--oversubscribe", "true"}, true, ""},
		{"0", []string{"-np", "100000", "--oversubscribe", "true"}, true, ""},
		{"maybe", []string{"-np", "100000", "true"}, false, `KOLO_OVERSUBSCRIBE="maybe": want 1 or 0`},
	}
	for _, tc := range tests {
		t.Setenv(jobenv.Oversubscribe, tc.env)
		o, err := Parse(tc.args, nil)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%s=%q %q: %v", jobenv.Oversubscribe, tc.env, tc.args, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s=%q %q: %v, want an error with %q", jobenv.Oversubscribe, tc.env, tc.args, err, tc.err)
		case err == nil && o.Oversubscribe != tc.want:
			t.Errorf("%s=%q %q: Oversubscribe %v, want %v", jobenv.Oversubscribe, tc.env, tc.args, o.Oversubscribe, tc.want)
		}
	}
}
