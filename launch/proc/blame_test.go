package proc

import (
	"io"
	"syscall"
	"testing"

	"github.com/kolo-dl/kolo/launch/layout"
	"github.com/kolo-dl/kolo/transport"
)

func TestBlame(t *testing.T) {
	failed := func(rank int, tail ...string) Result {
		return Result{Slot: layout.Slot{Rank: rank, Host: "h"}, Exit: Exit{Code: 3}, StderrTail: tail}
	}
	killed := func(rank int, sig syscall.Signal, stopped bool) Result {
		return Result{Slot: layout.Slot{Rank: rank, Host: "h"}, Exit: Exit{Code: -1, Signal: sig}, Stopped: stopped}
	}
	ok := func(rank int) Result { return Result{Slot: layout.Slot{Rank: rank, Host: "h"}} }
	lost1 := "kolo: allreduce kill.20: rank 1 on node0 lost during recv: EOF"

	cases := []struct {
		name    string
		results []Result
		first   int // index into results
		want    int // rank
	}{
		{"no trail", []Result{failed(0, "Traceback", "ValueError: bad"), killed(1, syscall.SIGTERM, true)}, 0, 0},
		{"names a rank killed outside the launcher",
			[]Result{failed(0, lost1), killed(1, syscall.SIGKILL, false), failed(2, lost1)}, 2, 1},
		{"named rank was marked stopped but died of SIGKILL first",
			[]Result{failed(0, lost1), killed(1, syscall.SIGKILL, true)}, 0, 1},
		{"named rank ended by the launcher's SIGTERM",
			[]Result{failed(0, lost1), killed(1, syscall.SIGTERM, true)}, 0, 0},
		{"named rank exited cleanly", []Result{failed(0, lost1), ok(1)}, 0, 0},
		{"named rank not in the results", []Result{failed(0, "rank 7 lost during send: EOF")}, 0, 0},
		{"an aborting rank the launcher stopped while it wound down", []Result{
			failed(0, "ABORT-RESULT err=rank 1 failed: bad batch"), killed(1, syscall.SIGTERM, true)}, 0, 1},
		{"an aborting rank that then exited cleanly is not the job's failure", []Result{
			failed(0, "ABORT-RESULT err=rank 1 failed: bad batch"), ok(1)}, 0, 0},
		{"the engine's other lost-peer form", []Result{
			failed(0, "rank 0: rank 1 (node0) lost: send requests to the coordinator: EOF"),
			killed(1, syscall.SIGKILL, false)}, 0, 1},
		{"real error texts", []Result{
			failed(0, (&transport.PeerError{Rank: 2, Host: "n1", Op: "recv", Err: io.EOF}).Error()),
			ok(1), killed(2, syscall.SIGBUS, false)}, 0, 2},
		{"abort notice", []Result{
			failed(0, "kolo.torch.KoloInternalError: rank 2 failed: ValueError: loss is nan"),
			ok(1),
			failed(2, "ValueError: loss is nan")}, 0, 2},
		{"a stuck rank the launcher stopped", []Result{
			failed(0, `STOP-RESULT err=rank 0: allreduce "w": rank 1 (node0) made no progress for 2s (barrier: ...)`),
			killed(1, syscall.SIGKILL, true)}, 0, 1},
		{"a stuck rank that ran again and failed, naming itself", []Result{
			failed(0, (&transport.StallError{Rank: 1, Host: "n0", Op: "recv", For: 2e9}).Error()),
			failed(1, "rank 1: rank 0: allreduce: rank 1 (n0) made no progress for 2s (recv)")}, 0, 1},
		{"a chain", []Result{
			failed(0, "err: rank 2 failed: rank 1 on n lost during recv: EOF"),
			killed(1, syscall.SIGSEGV, false),
			failed(2, lost1)}, 0, 1},
		{"a chain ends where the named rank is not to blame", []Result{
			failed(0, "x: rank 2 on n lost during recv: EOF"),
			ok(1),
			failed(2, lost1)}, 0, 2},
		{"a cycle stops", []Result{
			failed(0, "rank 1 lost during recv: EOF"),
			failed(1, "rank 0 lost during send: EOF")}, 0, 1},
		{"names itself", []Result{failed(0, "rank 0 failed: oops"), failed(1, "rank 0 failed: oops")}, 0, 0},
		{"last naming line wins", []Result{
			failed(0, "rank 1 lost during recv: EOF", "retrying", "rank 2 lost during send: EOF"),
			failed(1), failed(2)}, 0, 2},
		{"a rank number in other text is no trail", []Result{
			failed(0, "rank 1 has 3 tensors", "my rank 1 results are wrong"), failed(1)}, 0, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := Blame(tc.results, &tc.results[tc.first])
			if got == nil || got.Slot.Rank != tc.want {
				t.Fatalf("Blame = %+v, want rank %d", got, tc.want)
			}
		})
	}
	if Blame(nil, nil) != nil {
		t.Error("Blame(nil, nil) != nil")
	}
}
