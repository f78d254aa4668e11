package kolo_test

import (
	"fmt"
	"testing"

	"github.com/kolo-dl/kolo/testbed/e2e"
)

// Every op x dtype x reduction against the naive reference, as separate processes.
func TestOpsAcrossProcesses(t *testing.T) {
	t.Parallel()
	for _, np := range []int{1, 2, 3, 4, 5, 8} {
		t.Run(fmt.Sprintf("np=%d", np), func(t *testing.T) {
			t.Parallel()
			requireSuccess(t, e2e.Launch(t, "ops", e2e.LocalHosts(np), np, e2e.Options{}))
		})
	}
}

func TestBigTensors(t *testing.T) {
	t.Parallel()
	for _, np := range []int{2, 3, 8} {
		t.Run(fmt.Sprintf("np=%d", np), func(t *testing.T) {
			t.Parallel()
			requireSuccess(t, e2e.Launch(t, "big", e2e.LocalHosts(np), np, e2e.Options{}))
		})
	}
}

func TestSubmitOrderDiffers(t *testing.T) {
	t.Parallel()
	requireSuccess(t, e2e.Launch(t, "order", e2e.LocalHosts(4), 4, e2e.Options{}))
}

func TestMismatchNamesRanks(t *testing.T) {
	t.Parallel()
	requireSuccess(t, e2e.Launch(t, "mismatch", e2e.LocalHosts(3), 3, e2e.Options{}))
}

func TestJoin(t *testing.T) {
	t.Parallel()
	requireSuccess(t, e2e.Launch(t, "join", e2e.LocalHosts(3), 3, e2e.Options{}))
}
