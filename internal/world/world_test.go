package world

import (
	"reflect"
	"strings"
	"testing"

	"github.com/kolo-dl/kolo/internal/jobenv"
)

func TestCrossGroup(t *testing.T) {
	tests := []struct {
		name  string
		hosts []string
		rank  int
		local int
		want  []int
	}{
		{"2x2 local 0", []string{"a", "a", "b", "b"}, 0, 0, []int{0, 2}},
		{"2x2 local 1", []string{"a", "a", "b", "b"}, 3, 1, []int{1, 3}},
		{"3x1", []string{"a", "b", "c"}, 1, 0, []int{0, 1, 2}},
		{"uneven", []string{"a", "a", "b"}, 0, 0, nil},
		{"one host", []string{"a", "a"}, 1, 1, []int{1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := crossGroup(tc.hosts, jobenv.Job{Rank: tc.rank, LocalRank: tc.local})
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("crossGroup = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestSegmentName(t *testing.T) {
	a := segmentName(jobenv.Job{JobID: "j1", Rendezvous: "h:1", Hostname: "node/1 x"})
	b := segmentName(jobenv.Job{JobID: "j2", Rendezvous: "h:1", Hostname: "node/1 x"})
	if a == b {
		t.Error("different jobs share a segment name")
	}
	if strings.ContainsAny(a, "/ ") || !strings.HasPrefix(a, "kolo-") {
		t.Errorf("segment name %q is not a safe file name", a)
	}
	long := segmentName(jobenv.Job{JobID: "j", Hostname: strings.Repeat("h", 300)})
	if len(long) > 100 {
		t.Errorf("segment name of %d bytes", len(long))
	}
}
