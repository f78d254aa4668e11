package jobenv

import (
	"reflect"
	"strings"
	"testing"
)

func TestExpandNodelist(t *testing.T) {
	tests := []struct {
		in   string
		want []string
		err  string
	}{
		{"node1", []string{"node1"}, ""},
		{"node[01-03,07],gpu5", []string{"node01", "node02", "node03", "node07", "gpu5"}, ""},
		{"a[8-11]", []string{"a8", "a9", "a10", "a11"}, ""},
		{"r[1-2]n[1-2]", []string{"r1n1", "r1n2", "r2n1", "r2n2"}, ""},
		{"x,y[3],z", []string{"x", "y3", "z"}, ""},
		{"n[001-002]-ib", []string{"n001-ib", "n002-ib"}, ""},
		{"n[1-", nil, "unclosed"},
		{"n1]", nil, "unmatched"},
		{"n[3-1]", nil, "bad range"},
		{"n[a-b]", nil, "bad range"},
		{"n[x]", nil, "not a number"},
		{"", nil, "names no hosts"},
		{"n[0-99999999]", nil, "too large"},
		{"r[1-60000]n[1-60000]", nil, "more than"},
	}
	for _, tc := range tests {
		got, err := ExpandNodelist(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ExpandNodelist(%q) error %v, want %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ExpandNodelist(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

func FuzzExpandNodelist(f *testing.F) {
	for _, s := range []string{"node[01-03,07],gpu5", "r[1-2]n[1-2]", "[", "a]b[1-3"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		names, err := ExpandNodelist(s)
		if err == nil && (len(names) == 0 || len(names) > maxNodes*2) {
			t.Fatalf("%q: %d names without error", s, len(names))
		}
	})
}
