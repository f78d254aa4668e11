package kolo_test

import (
	"strings"
	"testing"

	"github.com/kolo-dl/kolo/testbed/e2e"
)

// Ranks on 2-3 network-namespace "hosts": TCP between hosts, shared memory within, and the
// hierarchical allreduce, for real.
func TestMultiHost(t *testing.T) {
	t.Parallel()
	ns := e2e.NewNetns(t, 3)
	tests := []struct {
		name     string
		slots    []int
		scenario string
		env      map[string]string
	}{
		{"3x2 flat", []int{2, 2, 2}, "ops", map[string]string{"KOLO_HIERARCHICAL_ALLREDUCE": "0"}},
		{"3x2 hierarchical", []int{2, 2, 2}, "ops", map[string]string{"KOLO_HIERARCHICAL_ALLREDUCE": "1"}},
		{"2x2 hierarchical big", []int{2, 2}, "big", map[string]string{"KOLO_HIERARCHICAL_ALLREDUCE": "1"}},
		{"uneven 2+1", []int{2, 1}, "ops", map[string]string{"KOLO_HIERARCHICAL_ALLREDUCE": "1"}},
		{"3x1 tcp only big", []int{1, 1, 1}, "big", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			np := 0
			for _, s := range tc.slots {
				np += s
			}
			job := e2e.Launch(t, tc.scenario, ns.Hosts(tc.slots...), np, e2e.Options{
				Env: tc.env, Listen: ns.Gateway + ":0", Advertise: ns.Gateway,
			})
			requireSuccess(t, job)
		})
	}
}

func TestMultiHostKilledRank(t *testing.T) {
	ns := e2e.NewNetns(t, 2)
	job := e2e.Launch(t, "kill", ns.Hosts(2, 2), 4, e2e.Options{Listen: ns.Gateway + ":0", Advertise: ns.Gateway, Grace: 15e9})
	if job.First == nil || job.First.Slot.Rank != 1 {
		t.Fatalf("first failure %+v, want rank 1\n%s", job.First, job.Stderr)
	}
	n := len(killResult.FindAllStringSubmatch(job.Stderr.String(), -1))
	if n != 3 {
		t.Errorf("%d ranks reported the loss, want 3:\n%s", n, job.Stderr)
	}
	for _, m := range killResult.FindAllStringSubmatch(job.Stderr.String(), -1) {
		if m[3] == "" || !strings.Contains(m[3], "rank 1") {
			t.Errorf("rank %s: %s", m[1], m[3])
		}
	}
}

// SIGSTOP the rank of one of 2 hosts mid-allreduce: TCP.
func TestMultiHostStoppedRank(t *testing.T) {
	ns := e2e.NewNetns(t, 2)
	testStoppedRank(t, "sigstop", ns.Hosts(1, 1), 2, e2e.Options{Listen: ns.Gateway + ":0", Advertise: ns.Gateway}, true)
}

// SIGSTOP rank 1 where other ranks wait on it only through ranks that wait on it: a TCP ring of 3
// (rank 0 waits on rank 2, which waits on rank 1), and 2 hosts x 2 ranks, hierarchical (rank 2
// waits at its host's barrier for rank 3, which waits on rank 1 across hosts). Every rank still
// names rank 1.
func TestMultiHostStoppedRankInChain(t *testing.T) {
	ns := e2e.NewNetns(t, 3)
	opt := e2e.Options{Listen: ns.Gateway + ":0", Advertise: ns.Gateway}
	t.Run("ring of 3", func(t *testing.T) { testStoppedRank(t, "sigstop", ns.Hosts(1, 1, 1), 3, opt, false) })
	t.Run("2x2 hierarchical", func(t *testing.T) { testStoppedRank(t, "sigstop", ns.Hosts(2, 2), 4, opt, false) })
}
