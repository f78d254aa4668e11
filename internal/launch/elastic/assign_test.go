package elastic

import (
	"fmt"
	"strings"
	"testing"
)

func w(host string, slot int) Worker { return Worker{Host: host, Slot: slot} }

// TestAssign pins layouts; each rank prints as "host[slot]:local/lsize:cross/csize".
func TestAssign(t *testing.T) {
	tests := []struct {
		name      string
		survivors []Worker
		hosts     []Host
		max       int
		want      string
		err       string
	}{
		{name: "first generation fills hosts in order", hosts: []Host{{"a", 2}, {"b", 2}}, max: 4,
			want: "a[0]:0/2:0/2 a[1]:1/2:0/2 b[0]:0/2:1/2 b[1]:1/2:1/2"},
		{name: "max-np caps", hosts: []Host{{"a", 2}, {"b", 2}}, max: 3,
			want: "a[0]:0/2:0/2 a[1]:1/2:0/1 b[0]:0/1:1/2"},
		{name: "uneven hosts: cross ranks per local rank", hosts: []Host{{"a", 1}, {"b", 3}, {"c", 2}}, max: 8,
			want: "a[0]:0/1:0/3 b[0]:0/3:1/3 b[1]:1/3:0/2 b[2]:2/3:0/1 c[0]:0/2:2/3 c[1]:1/2:1/2"},
		{name: "survivors first, in their order", survivors: []Worker{w("b", 0), w("b", 1)}, hosts: []Host{{"a", 2}, {"b", 2}}, max: 4,
			want: "b[0]:0/2:0/2 b[1]:1/2:0/2 a[0]:0/2:1/2 a[1]:1/2:1/2"},
		{name: "survivors' hosts fill first", survivors: []Worker{w("b", 0)}, hosts: []Host{{"a", 2}, {"b", 3}}, max: 4,
			want: "b[0]:0/3:0/2 b[1]:1/3:0/1 b[2]:2/3:0/1 a[0]:0/1:1/2"},
		{name: "survivors in any order keep it", survivors: []Worker{w("b", 0), w("a", 0)}, hosts: []Host{{"a", 2}, {"b", 1}}, max: 3,
			want: "b[0]:0/1:0/2 a[0]:0/2:1/2 a[1]:1/2:0/1"},
		{name: "no free slot", survivors: []Worker{w("a", 0), w("a", 1)}, hosts: []Host{{"a", 2}}, max: 4,
			want: "a[0]:0/2:0/1 a[1]:1/2:0/1"},
		{name: "no hosts", max: 4, want: ""},
		{name: "localhost and 127.0.0.1 are two hosts", hosts: []Host{{"localhost", 1}, {"127.0.0.1", 1}}, max: 2,
			want: "localhost[0]:0/1:0/2 127.0.0.1[0]:0/1:1/2"},

		{name: "survivor on a missing host", survivors: []Worker{w("z", 0)}, hosts: []Host{{"a", 1}}, max: 2, err: "survivor z[0] is on a host that is not available"},
		{name: "survivor beyond its slots", survivors: []Worker{w("a", 2)}, hosts: []Host{{"a", 2}}, max: 2, err: "outside the 2 slots"},
		{name: "survivor twice", survivors: []Worker{w("a", 0), w("a", 0)}, hosts: []Host{{"a", 2}}, max: 2, err: "listed twice"},
		{name: "more survivors than max-np", survivors: []Worker{w("a", 0), w("a", 1)}, hosts: []Host{{"a", 2}}, max: 1, err: "exceed --max-np 1"},
		{name: "host twice", hosts: []Host{{"a", 1}, {"a", 1}}, max: 2, err: `host "a" listed twice`},
		{name: "host with no slots", hosts: []Host{{"a", 0}}, max: 2, err: "has 0 slots"},
		{name: "max-np 0", hosts: []Host{{"a", 1}}, max: 0, err: "max-np must be at least 1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ranks, err := Assign(tc.survivors, tc.hosts, tc.max)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %v, %v; want an error containing %q", ranks, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for i, r := range ranks {
				if r.Rank != i || r.Size != len(ranks) {
					t.Errorf("rank %d of %d at index %d", r.Rank, r.Size, i)
				}
				if ref := referenceRank(workersOf(ranks), i); r != ref {
					t.Errorf("rank %d = %+v, reference %+v", i, r, ref)
				}
				got = append(got, fmt.Sprintf("%s:%d/%d:%d/%d", r.Worker, r.LocalRank, r.LocalSize, r.CrossRank, r.CrossSize))
			}
			if s := strings.Join(got, " "); s != tc.want {
				t.Errorf("got  %s\nwant %s", s, tc.want)
			}
		})
	}
}

func workersOf(ranks []Rank) []Worker {
	ws := make([]Worker, len(ranks))
	for i, r := range ranks {
		ws[i] = r.Worker
	}
	return ws
}

func TestFormatWorkers(t *testing.T) {
	got := formatWorkers([]Worker{w("a", 0), w("a", 1), w("a", 2), w("b", 1), w("a", 4), w("::1", 0)})
	if want := "a[0-2,4],b[1],[::1][0]"; got != want {
		t.Errorf("formatWorkers = %q, want %q", got, want)
	}
}

// referenceRank computes rank i's numbers the obvious way, straight from the definitions.
func referenceRank(ws []Worker, i int) Rank {
	me := ws[i]
	r := Rank{Worker: me, Rank: i, Size: len(ws)}
	firstRank := map[string]int{}
	for j, w := range ws {
		if _, ok := firstRank[w.Host]; !ok {
			firstRank[w.Host] = j
		}
		if w.Host == me.Host {
			r.LocalSize++
			if w.Slot < me.Slot {
				r.LocalRank++
			}
		}
	}
	for h, first := range firstRank {
		n := 0
		for _, w := range ws {
			if w.Host == h {
				n++
			}
		}
		if n > r.LocalRank {
			r.CrossSize++
			if first < firstRank[me.Host] {
				r.CrossRank++
			}
		}
	}
	return r
}
