package kolo_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/kolo-dl/kolo/testbed/e2e"
)

// Process sets {0,1} and {1,2} across 3 processes: each runs without the rank outside it, both at
// once, every collective within a set, errors, collective removal (testbed/e2e/scenarios_processsets.go).
func TestProcessSetsAcrossProcesses(t *testing.T) {
	t.Parallel()
	requireSuccess(t, e2e.Launch(t, "processsets", e2e.LocalHosts(3), 3, e2e.Options{}))
}

// HOROVOD_TIMELINE set for every rank: rank 0 alone writes a loadable trace of the job's ops.
func TestTimelineFromEnvironment(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "timeline.json")
	requireSuccess(t, e2e.Launch(t, "timeline", e2e.LocalHosts(2), 2, e2e.Options{Env: map[string]string{
		"HOROVOD_TIMELINE":             path,
		"HOROVOD_TIMELINE_MARK_CYCLES": "1",
	}}))
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var evs []struct {
		Name string         `json:"name"`
		Ph   string         `json:"ph"`
		Args map[string]any `json:"args"`
	}
	if err := json.Unmarshal(data, &evs); err != nil {
		t.Fatalf("timeline is not JSON: %v", err)
	}
	var rows, names []string
	for _, e := range evs {
		if e.Ph == "M" && e.Name == "process_name" {
			rows = append(rows, e.Args["name"].(string))
		} else {
			names = append(names, e.Name)
		}
	}
	for _, want := range []string{"allreduce.tl.a", "allreduce.tl.b", "allgather.tl.g"} {
		if !slices.Contains(rows, want) {
			t.Errorf("no row for %s in %v", want, rows)
		}
	}
	for _, want := range []string{"NEGOTIATE_ALLREDUCE", "ALLREDUCE", "KOLO_ALLREDUCE", "NEGOTIATE_ALLGATHER", "KOLO_ALLGATHER", "rank 0", "rank 1", "CYCLE_START"} {
		if !slices.Contains(names, want) {
			t.Errorf("no %s event", want)
		}
	}
	if others, _ := filepath.Glob(filepath.Join(dir, "*")); len(others) != 1 {
		t.Errorf("files written: %v, want rank 0's only", others)
	}
}
