package kolo_test

import (
	"testing"

	"github.com/kolo-dl/kolo/testbed/e2e"
)

// Strangers connecting to the running job (random bytes, a wrong secret) are turned away while the
// job goes on and finishes correctly.
func TestStrangersRejectedWhileJobRuns(t *testing.T) {
	t.Parallel()
	job := e2e.Launch(t, "steady", e2e.LocalHosts(3), 3, e2e.Options{Intrude: true})
	requireSuccess(t, job)
	if job.Intrusions < 8 { // rendezvous + 3 listeners, 2 kinds each
		t.Errorf("only %d intruding connections were made; the test did not exercise the listeners", job.Intrusions)
	}
}
