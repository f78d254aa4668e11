package layout

import (
	"reflect"
	"strings"
	"testing"
)

func TestPlan(t *testing.T) {
	type rc struct{ rank, local, localSize, cross, crossSize int }
	tests := []struct {
		name  string
		hosts string
		np    int
		want  []rc
		err   string
	}{
		{"one host", "localhost:4", 3, []rc{{0, 0, 3, 0, 1}, {1, 1, 3, 0, 1}, {2, 2, 3, 0, 1}}, ""},
		{"two even", "a:2,b:2", 4, []rc{{0, 0, 2, 0, 2}, {1, 1, 2, 0, 2}, {2, 0, 2, 1, 2}, {3, 1, 2, 1, 2}}, ""},
		// Uneven: a has 3, b has 1. Local rank 0 exists on both hosts; 1 and 2 only on a.
		{"uneven", "a:3,b:1", 4, []rc{{0, 0, 3, 0, 2}, {1, 1, 3, 0, 1}, {2, 2, 3, 0, 1}, {3, 0, 1, 1, 2}}, ""},
		{"partial last host", "a:2,b:2,c:2", 5, []rc{
			{0, 0, 2, 0, 3}, {1, 1, 2, 0, 2}, {2, 0, 2, 1, 3}, {3, 1, 2, 1, 2}, {4, 0, 1, 2, 3}}, ""},
		{"unused host", "a:2,b:2", 2, []rc{{0, 0, 2, 0, 1}, {1, 1, 2, 0, 1}}, ""},
		{"too many", "a:2,b:1", 4, nil, "-np 4 exceeds the 3 slots available: a:2,b:1"},
		{"zero np", "a:2", 0, nil, "-np must be at least 1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			hosts, err := ParseHosts(tc.hosts)
			if err != nil {
				t.Fatal(err)
			}
			slots, err := Plan(hosts, tc.np)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %v, want error %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []rc
			for _, s := range slots {
				got = append(got, rc{s.Rank, s.LocalRank, s.LocalSize, s.CrossRank, s.CrossSize})
				if s.Size != tc.np {
					t.Errorf("rank %d size %d", s.Rank, s.Size)
				}
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("plan\n got %v\nwant %v", got, tc.want)
			}
		})
	}
}

func TestParseHosts(t *testing.T) {
	tests := []struct {
		spec string
		want []Host
		err  string
	}{
		{"localhost:2,10.0.0.7:2", []Host{{"localhost", 2}, {"10.0.0.7", 2}}, ""},
		{"a,b:3", []Host{{"a", 1}, {"b", 3}}, ""},
		{"a:1,a:2", []Host{{"a", 3}}, ""},
		{"[fe80::1]:2,[::1]", []Host{{"fe80::1", 2}, {"::1", 1}}, ""},
		{"a:0", nil, "positive integer"},
		{"a:x", nil, "positive integer"},
		{":2", nil, "empty host name"},
		{"", nil, "names no hosts"},
		{"[fe80::1", nil, "unclosed"},
		{"localhost:2:3", nil, `host name "localhost:2" has ':'`},
		{"-oProxyCommand=touch /tmp/x:1", nil, "starts with '-'"},
		{"node 1:2", nil, `has ' '`},
		{"root@node1:2", nil, `has '@'`},
		{"node-1.cluster_a:2", []Host{{"node-1.cluster_a", 2}}, ""},
	}
	for _, tc := range tests {
		got, err := ParseHosts(tc.spec)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseHosts(%q) error %v, want %q", tc.spec, err, tc.err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ParseHosts(%q) = %v, %v; want %v", tc.spec, got, err, tc.want)
		}
	}
}

func TestParseHostfile(t *testing.T) {
	tests := []struct {
		name, text string
		want       []Host
		err        string
	}{
		{"basic", "# cluster\nnode1 slots=4\nnode2 slots=2  # gpu box\n\nnode3\n",
			[]Host{{"node1", 4}, {"node2", 2}, {"node3", 1}}, ""},
		{"max_slots ignored", "n1 slots=2 max_slots=8\n", []Host{{"n1", 2}}, ""},
		{"bad slots", "n1 slots=2\nn2 slots=two\n", nil, "hf:2: slots must be a positive integer"},
		{"unknown attr", "n1 cpus=2\n", nil, `hf:1: unknown attribute "cpus"`},
		{"no equals", "n1 4\n", nil, `hf:1: unexpected "4"`},
		{"attr first", "slots=4\n", nil, "hf:1: expected a host name first"},
		{"empty", "# nothing\n\n", nil, "hf: no hosts listed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseHostfile("hf", strings.NewReader(tc.text))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %v, want error %q", err, tc.err)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}
