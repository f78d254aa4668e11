package jobenv

import (
	"fmt"
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

func TestNodeRecordsRoundTrip(t *testing.T) {
	join := NodeJoin{Hostname: "node-a", Slots: 4, Addr: "10.0.0.2", Flags: "-np 4 --min-np 2", NodeRank: -1}
	if got, err := DecodeNodeJoin(join.Encode()); err != nil || got != join {
		t.Errorf("join: got %+v, %v; want %+v", got, err, join)
	}
	noAddr := NodeJoin{Hostname: "b", Slots: 1, NodeRank: -1}
	if got, err := DecodeNodeJoin(noAddr.Encode()); err != nil || got != noAddr {
		t.Errorf("join without address: got %+v, %v", got, err)
	}
	for _, static := range []NodeJoin{
		{Hostname: "c", Slots: 2, Addr: "10.0.0.3", Static: true, NNodes: 3, NP: 6, NodeRank: 2},
		{Hostname: "d", Slots: 1, Static: true, NNodes: 2, NodeRank: -1},
	} {
		if got, err := DecodeNodeJoin(static.Encode()); err != nil || got != static {
			t.Errorf("static join: got %+v, %v; want %+v", got, err, static)
		}
	}
	for _, w := range []NodeWelcome{
		{Host: "node-a-node2", JobID: "0123abcd", Timeout: 1500 * time.Millisecond},
		{Host: "node-b", JobID: "0123abcd", Static: true},
		{Refused: "node on b was started with --min-np 1, the serving node with --min-np 2\nsecond line"},
	} {
		if got, err := DecodeNodeWelcome(w.Encode()); err != nil || got != w {
			t.Errorf("welcome: got %+v, %v; want %+v", got, err, w)
		}
	}
	for _, o := range []NodeOrder{
		{Kind: OrderStart, Worker: 3, Slot: 1, Round: 2, Rank: 2, Size: 4, LocalRank: 1, LocalSize: 2, CrossRank: 1, CrossSize: 2},
		{Kind: OrderStart, Worker: 1, Slot: 0, Round: 0, Rank: 1, Size: 2, LocalRank: 0, LocalSize: 1, CrossRank: 1, CrossSize: 2},
		{Kind: OrderStop, Worker: 3, Signal: 15},
		{Kind: OrderEnd, Code: 1, Reason: "kolo run: elastic: the job failed: below min-np\nOther workers: a[0]: exited 0"},
		{Kind: OrderEnd},
	} {
		if got, err := DecodeNodeOrder(o.Encode()); err != nil || got != o {
			t.Errorf("order: got %+v, %v; want %+v", got, err, o)
		}
	}
	for _, e := range []NodeExit{
		{Worker: 1, Code: 3, Tail: []string{"Traceback (most recent call last):", "ValueError: bad  batch"}},
		{Worker: 2, Code: -1, Signal: 9, Leaving: true},
		{Worker: 5, Code: -1, Err: "start: fork/exec prog: no such file"},
	} {
		got, err := DecodeNodeExit(e.Encode())
		if err != nil || fmt.Sprint(got) != fmt.Sprint(e) {
			t.Errorf("exit: got %+v, %v; want %+v", got, err, e)
		}
	}
	// A line break inside a tail line or an error cannot forge another field.
	e, err := DecodeNodeExit(NodeExit{Worker: 1, Code: 1, Err: "a\nexit 2", Tail: []string{"x\ntail y"}}.Encode())
	if err != nil || e.Err != "a exit 2" || len(e.Tail) != 1 {
		t.Errorf("multi-line fields: %+v, %v", e, err)
	}
}

func TestNodeRecordsReject(t *testing.T) {
	for _, tc := range []struct {
		name   string
		decode func([]byte) error
		in     string
		want   string
	}{
		{"join empty", joinErr, "", "empty record"},
		{"join slots", joinErr, "join 0 a -\n", "bad slot count"},
		{"join fields", joinErr, "join 1 a\n", "bad header"},
		{"join static fields", joinErr, "join 1 a - static 2 0\n", "bad header"},
		{"join node count", joinErr, "join 1 a - static 0 0 -\n", "bad node count"},
		{"join node rank", joinErr, "join 1 a - static 2 0 x\n", "bad node rank"},
		{"welcome timeout", welcomeErr, "welcome a j 0\n", "bad timeout"},
		{"welcome nan", welcomeErr, "welcome a j NaN\n", "bad timeout"},
		{"welcome header", welcomeErr, "hello a j 1\n", "bad header"},
		{"order kind", orderErr, "restart 1\n", "bad header"},
		{"order empty", orderErr, "\n", "empty header"},
		{"order rank", orderErr, "start 1 0 1 4 4 0 1 0 1\n", "rank 4 outside"},
		{"order worker", orderErr, "start 0 0 1 0 1 0 1 0 1\n", "bad worker"},
		{"order round", orderErr, "start 1 0 -1 0 1 0 1 0 1\n", "bad worker, slot or round"},
		{"order signal", orderErr, "stop 1 99\n", "bad worker or signal"},
		{"order code", orderErr, "end 300\n", "bad exit code"},
		{"exit header", exitErr, "exit 1 0\n", "bad header"},
		{"exit code", exitErr, "exit 1 256 0\n", "bad worker, code or signal"},
		{"exit line", exitErr, "exit 1 0 0\nstdout hello\n", "bad line"},
		{"too long", exitErr, "exit 1 0 0\ntail " + strings.Repeat("x", maxNodeRecord), "more than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.decode([]byte(tc.in)); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("decoding %.60q: %v, want an error containing %q", tc.in, err, tc.want)
			}
		})
	}
}

func joinErr(b []byte) error    { _, err := DecodeNodeJoin(b); return err }
func welcomeErr(b []byte) error { _, err := DecodeNodeWelcome(b); return err }
func orderErr(b []byte) error   { _, err := DecodeNodeOrder(b); return err }
func exitErr(b []byte) error    { _, err := DecodeNodeExit(b); return err }

// Each node record decoder reads bytes from the network: whatever it accepts re-encodes to a
// record it decodes to the same value.
func FuzzDecodeNodeJoin(f *testing.F) {
	f.Add([]byte("join 2 node-a 10.0.0.2\n-np 4"))
	f.Add([]byte("join 2 node-a - static 3 6 1\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if n, err := DecodeNodeJoin(b); err == nil {
			if again, err := DecodeNodeJoin(n.Encode()); err != nil || again != n {
				t.Fatalf("%q: re-decoded %+v, %v; want %+v", b, again, err, n)
			}
		}
	})
}

func FuzzDecodeNodeWelcome(f *testing.F) {
	f.Add([]byte("welcome a j 1.5\n"))
	f.Add([]byte("welcome a j static\n"))
	f.Add([]byte("refused\nwhy"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if w, err := DecodeNodeWelcome(b); err == nil {
			again, err := DecodeNodeWelcome(w.Encode())
			if err != nil || again.Host != w.Host || again.JobID != w.JobID || again.Static != w.Static || again.Refused != w.Refused {
				t.Fatalf("%q: re-decoded %+v, %v; want %+v", b, again, err, w)
			}
		}
	})
}

func FuzzDecodeNodeOrder(f *testing.F) {
	f.Add([]byte("start 3 1 2 2 4 1 2 1 2\n"))
	f.Add([]byte("stop 3 15\n"))
	f.Add([]byte("end 1\nwhy"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if o, err := DecodeNodeOrder(b); err == nil {
			if again, err := DecodeNodeOrder(o.Encode()); err != nil || again != o {
				t.Fatalf("%q: re-decoded %+v, %v; want %+v", b, again, err, o)
			}
		}
	})
}

func FuzzDecodeNodeExit(f *testing.F) {
	f.Add([]byte("exit 1 3 0\nerr boom\ntail a line\n"))
	f.Add([]byte("exit 2 -1 9 leaving\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if e, err := DecodeNodeExit(b); err == nil {
			again, err := DecodeNodeExit(e.Encode())
			if err != nil || again.Worker != e.Worker || again.Code != e.Code || again.Leaving != e.Leaving || len(again.Tail) != len(e.Tail) {
				t.Fatalf("%q: re-decoded %+v, %v; want %+v", b, again, err, e)
			}
		}
	})
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
