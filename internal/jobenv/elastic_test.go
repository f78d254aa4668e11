package jobenv

import (
	"strings"
	"testing"
	"time"
)

func TestRoundRoundTrip(t *testing.T) {
	r := Round{Number: 3, Generation: 2, Ranks: []RoundRank{
		{Place: Place{"a", 0}, LocalRank: 0, LocalSize: 2, CrossRank: 0, CrossSize: 2},
		{Place: Place{"b", 1}, LocalRank: 0, LocalSize: 1, CrossRank: 1, CrossSize: 2},
		{Place: Place{"a", 1}, LocalRank: 1, LocalSize: 2, CrossRank: 0, CrossSize: 1},
	}}
	got, err := DecodeRound(r.Encode())
	if err != nil {
		t.Fatal(err)
	}
	if got.Number != 3 || got.Generation != 2 || len(got.Ranks) != 3 || got.Ranks[1] != r.Ranks[1] || got.End != "" {
		t.Fatalf("round trip: got %+v, want %+v", got, r)
	}
	base := Job{Rendezvous: "127.0.0.1:5", JobID: "j"}
	j, ok := got.Job(Place{"a", 1}, base)
	want := Job{Rank: 2, Size: 3, LocalRank: 1, LocalSize: 2, CrossRank: 0, CrossSize: 1, Hostname: "a", Rendezvous: "127.0.0.1:5", JobID: "j.r3"}
	if !ok || j != want {
		t.Fatalf("Job(a[1]) = %+v, %v; want %+v", j, ok, want)
	}
	if _, ok := got.Job(Place{"c", 0}, base); ok {
		t.Fatal("Job found a place the round does not have")
	}

	end, err := DecodeRound(Round{Number: 4, End: "below min-np: 1 slot\nwaited 600 s"}.Encode())
	if err != nil || end.Number != 4 || end.End != "below min-np: 1 slot\nwaited 600 s" {
		t.Fatalf("end record: %+v, %v", end, err)
	}
}

func TestDecodeRoundRejects(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"empty", "", "empty record"},
		{"header", "round x generation 1 size 1\n", "bad header"},
		{"zero size", "round 1 generation 1 size 0\n", "bad header"},
		{"short line", "round 1 generation 1 size 1\nrank 0 a 0 0 1 0\n", "bad rank line"},
		{"order", "round 1 generation 1 size 2\nrank 1 a 0 0 2 0 1\nrank 0 a 1 1 2 0 1\n", "out of order"},
		{"local rank", "round 1 generation 1 size 1\nrank 0 a 0 1 1 0 1\n", "local rank 1 outside"},
		{"twice", "round 1 generation 1 size 2\nrank 0 a 0 0 2 0 1\nrank 1 a 0 1 2 0 1\n", "a[0] has two ranks"},
		{"count", "round 1 generation 1 size 2\nrank 0 a 0 0 2 0 1\n", "2, 1 rank lines follow"},
		{"negative slot", "round 1 generation 1 size 1\nrank 0 a -1 0 1 0 1\n", "negative slot"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeRound([]byte(tc.in))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("DecodeRound(%q) = %v, want an error containing %q", tc.in, err, tc.want)
			}
		})
	}
}

func FuzzDecodeRound(f *testing.F) {
	f.Add([]byte("round 1 generation 1 size 1\nrank 0 a 0 0 1 0 1\n"))
	f.Add([]byte("round 2 end\nreason"))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeRound(b)
		if err != nil || r.End != "" {
			return
		}
		again, err := DecodeRound(r.Encode())
		if err != nil || len(again.Ranks) != len(r.Ranks) {
			t.Fatalf("re-decoding %q: %v", r.Encode(), err)
		}
	})
}

func TestElasticPlace(t *testing.T) {
	p, round, ok, err := ElasticPlace(map[string]string{Elastic: "1", ElasticHost: "h", ElasticSlot: "2", ElasticRound: "5"})
	if err != nil || !ok || p != (Place{"h", 2}) || round != 5 {
		t.Fatalf("got %v %d %v %v", p, round, ok, err)
	}
	if _, _, ok, err := ElasticPlace(map[string]string{}); ok || err != nil {
		t.Fatalf("not elastic: ok %v err %v", ok, err)
	}
	for _, env := range []map[string]string{
		{Elastic: "1", ElasticSlot: "0", ElasticRound: "1"},
		{Elastic: "1", ElasticHost: "h", ElasticSlot: "-1", ElasticRound: "1"},
		{Elastic: "1", ElasticHost: "h", ElasticSlot: "0", ElasticRound: "0"},
	} {
		if _, _, _, err := ElasticPlace(env); err == nil {
			t.Errorf("ElasticPlace(%v): no error", env)
		}
	}
}

func TestElasticTimeoutFrom(t *testing.T) {
	const HorovodElasticTimeout = "HOROVOD_ELASTIC_TIMEOUT"
	for _, tc := range []struct {
		env  map[string]string
		want time.Duration
		bad  bool
	}{
		{map[string]string{}, DefaultElasticTimeout, false},
		{map[string]string{HorovodElasticTimeout: "30"}, 30 * time.Second, false},
		{map[string]string{ElasticTimeout: "1.5", HorovodElasticTimeout: "30"}, 1500 * time.Millisecond, false},
		{map[string]string{ElasticTimeout: "0"}, 0, true},
		{map[string]string{HorovodElasticTimeout: "soon"}, 0, true},
	} {
		got, err := ElasticTimeoutFrom(tc.env)
		if (err != nil) != tc.bad || got != tc.want {
			t.Errorf("ElasticTimeoutFrom(%v) = %v, %v", tc.env, got, err)
		}
	}
}

func TestReinitRoundTrip(t *testing.T) {
	in := []Place{{"10.0.0.2", 1}, {"b", 0}}
	got, err := DecodeReinit(EncodeReinit(in))
	if err != nil || len(got) != 2 || got[0] != in[0] || got[1] != in[1] {
		t.Fatalf("round trip: %v, %v", got, err)
	}
	for _, none := range []string{"", "1", "\n"} {
		if got, err := DecodeReinit([]byte(none)); err != nil || got != nil {
			t.Errorf("DecodeReinit(%q) = %v, %v; want nobody", none, got, err)
		}
	}
	for _, bad := range []string{"suspect a", "suspect a -1", "blame a 0", "suspect a x"} {
		if _, err := DecodeReinit([]byte(bad)); err == nil {
			t.Errorf("DecodeReinit(%q): no error", bad)
		}
	}
}

func FuzzDecodeReinit(f *testing.F) {
	f.Add([]byte("suspect a 0\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		ps, err := DecodeReinit(b)
		if err != nil {
			return
		}
		again, err := DecodeReinit(EncodeReinit(ps))
		if err != nil || len(again) != len(ps) {
			t.Fatalf("re-decoding %v: %v, %v", ps, again, err)
		}
	})
}
