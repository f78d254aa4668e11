package launch

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

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
