package timeline

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

type traceEvent struct {
	Name string         `json:"name"`
	Ph   string         `json:"ph"`
	Ts   float64        `json:"ts"`
	Pid  int            `json:"pid"`
	S    string         `json:"s"`
	Args map[string]any `json:"args"`
}

func readTrace(t *testing.T, path string) []traceEvent {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return parseTrace(t, data)
}

func parseTrace(t *testing.T, data []byte) []traceEvent {
	t.Helper()
	var evs []traceEvent
	if err := json.Unmarshal(data, &evs); err != nil {
		t.Fatalf("trace is not a JSON array: %v\n%s", err, data)
	}
	return evs
}

// readSettledTrace is readTrace for a file being written: a read that overlaps one of the
// writer's (the file grew between the reader's read calls) is torn, so a file counts only once
// two reads in a row agree; what it then holds must be valid, since the writer leaves a valid
// file after every write.
func readSettledTrace(t *testing.T, path string) []traceEvent {
	t.Helper()
	prev, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for range 100 {
		time.Sleep(2 * time.Millisecond)
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Equal(data, prev) {
			return parseTrace(t, data)
		}
		prev = data
	}
	t.Fatalf("%s kept changing for 100 reads", path)
	return nil
}

// rows renders each tensor's events as "label: ph name, ph name, ..." in file order (timestamps
// checked separately), keyed by label.
func rows(t *testing.T, evs []traceEvent) map[string]string {
	t.Helper()
	label := map[int]string{}
	seq := map[int][]string{}
	last := map[int]float64{}
	for _, e := range evs {
		if e.Ph == "M" {
			if e.Name == "process_name" {
				label[e.Pid] = e.Args["name"].(string)
			}
			continue
		}
		if e.Ts < last[e.Pid] {
			t.Errorf("pid %d: time goes back at %+v", e.Pid, e)
		}
		last[e.Pid] = e.Ts
		s := e.Ph
		if e.Name != "" {
			s += " " + e.Name
		}
		seq[e.Pid] = append(seq[e.Pid], s)
	}
	out := map[string]string{}
	for pid, s := range seq {
		name := label[pid]
		if pid == 0 {
			name = "(global)"
		}
		out[name] = strings.Join(s, ", ")
	}
	return out
}

func TestKnownSequence(t *testing.T) {
	path := filepath.Join(t.TempDir(), "trace.json")
	tl, err := Start(path, true)
	if err != nil {
		t.Fatal(err)
	}
	fused := []string{"grad.a", `grad."b"`}
	tl.Cycle()
	tl.Submitted(0, "grad.a", "ALLREDUCE", 1)
	tl.Submitted(0, "grad.a", "ALLREDUCE", 0)
	tl.Submitted(0, `grad."b"`, "ALLREDUCE", 0)
	tl.Submitted(0, `grad."b"`, "ALLREDUCE", 1)
	tl.Negotiated(0, fused, "ALLREDUCE")
	tl.Activity(0, fused, "MEMCPY_IN_FUSION_BUFFER")
	tl.Activity(0, fused, "KOLO_ALLREDUCE")
	tl.Activity(0, fused, "MEMCPY_OUT_FUSION_BUFFER")
	tl.Done(0, fused)
	tl.Cycle()
	tl.Mark(`AUTOTUNE fusion 1 MiB, cycle "2" ms`) // quotes dropped: the file stays JSON
	// The same name in another process set is another row; an op decided for a set this rank is not
	// in ends at its decision.
	tl.Submitted(2, "grad.a", "BROADCAST", 3)
	tl.Done(2, []string{"grad.a"})
	// An activity for an op whose decision was not recorded is dropped, not left unbalanced.
	tl.Activity(0, []string{"late"}, "KOLO_ALLGATHER")
	if err := tl.Stop(); err != nil {
		t.Fatal(err)
	}
	tl.Submitted(0, "after.stop", "ALLREDUCE", 0) // dropped
	if err := tl.Stop(); err != nil {
		t.Fatal(err)
	}
	got := rows(t, readTrace(t, path))
	want := map[string]string{
		"(global)": "i CYCLE_START, i CYCLE_START, i AUTOTUNE fusion 1 MiB, cycle 2 ms",
		"grad.a": "B NEGOTIATE_ALLREDUCE, i rank 1, i rank 0, E, B ALLREDUCE, B QUEUE, E, B MEMCPY_IN_FUSION_BUFFER, E, " +
			"B KOLO_ALLREDUCE, E, B MEMCPY_OUT_FUSION_BUFFER, E, E",
		`grad."b"`: "B NEGOTIATE_ALLREDUCE, i rank 0, i rank 1, E, B ALLREDUCE, B QUEUE, E, B MEMCPY_IN_FUSION_BUFFER, E, " +
			"B KOLO_ALLREDUCE, E, B MEMCPY_OUT_FUSION_BUFFER, E, E",
		"grad.a (process set 2)": "B NEGOTIATE_BROADCAST, i rank 3, E",
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("row %q:\n got %s\nwant %s", k, got[k], w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("rows %v, want %d", got, len(want))
	}
}

// The file is a complete JSON array after every write, before Stop: a killed process leaves a
// loadable trace.
func TestValidWhileRunning(t *testing.T) {
	path := filepath.Join(t.TempDir(), "trace.json")
	tl, err := Start(path, false)
	if err != nil {
		t.Fatal(err)
	}
	defer tl.Stop()
	if evs := readTrace(t, path); len(evs) != 0 {
		t.Fatalf("fresh trace has %d events", len(evs))
	}
	for i := range 3 {
		name := fmt.Sprintf("t%d", i)
		tl.Submitted(0, name, "ALLREDUCE", 0)
		tl.Negotiated(0, []string{name}, "ALLREDUCE")
		tl.Done(0, []string{name})
		deadline := time.Now().Add(10 * time.Second)
		for {
			if _, ok := rows(t, readSettledTrace(t, path))[name]; ok {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s not written within 10 s", name)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	tl.Cycle() // not marking cycles: nothing
	if err := tl.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, ok := rows(t, readTrace(t, path))["(global)"]; ok {
		t.Error("cycle marker written though cycles are not marked")
	}
}

func TestConcurrentRecordingAndStop(t *testing.T) {
	path := filepath.Join(t.TempDir(), "trace.json")
	tl, err := Start(path, true)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 3 * flushBurst / 4 {
				names := []string{fmt.Sprintf("g%d.%d", g, i%50)}
				tl.Submitted(0, names[0], "ALLGATHER", g)
				tl.Negotiated(0, names, "ALLGATHER")
				tl.Activity(0, names, "KOLO_ALLGATHER")
				tl.Done(0, names)
				tl.Cycle()
			}
		}()
	}
	time.Sleep(10 * time.Millisecond)
	stopErr := tl.Stop() // while recording goes on
	wg.Wait()
	if stopErr != nil {
		t.Fatal(stopErr)
	}
	readTrace(t, path)
}

// Stop called from several goroutines at once, while others keep recording: every call returns
// only once the file is complete (each caller may read it at once, as kolo.StopTimeline's callers
// do), and all return the same result.
func TestConcurrentStops(t *testing.T) {
	const stoppers, recorded = 4, 200
	for round := range 10 {
		path := filepath.Join(t.TempDir(), fmt.Sprintf("trace%d.json", round))
		tl, err := Start(path, true)
		if err != nil {
			t.Fatal(err)
		}
		for i := range recorded { // before any Stop: every one must be in the file
			tl.Submitted(0, fmt.Sprintf("before.%d", i), "ALLREDUCE", 0)
		}
		start := make(chan struct{})
		var wg sync.WaitGroup
		for g := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				for i := range 1000 {
					tl.Cycle()
					tl.Submitted(0, fmt.Sprintf("racing.%d.%d", g, i%10), "ALLGATHER", g)
				}
			}()
		}
		errs := make(chan error, stoppers)
		for range stoppers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				if err := tl.Stop(); err != nil {
					errs <- err
					return
				}
				data, err := os.ReadFile(path)
				if err != nil {
					errs <- err
					return
				}
				var evs []traceEvent
				if err := json.Unmarshal(data, &evs); err != nil {
					errs <- fmt.Errorf("Stop returned before the trace was complete JSON: %v", err)
					return
				}
				n := 0
				for _, e := range evs {
					if e.Ph == "i" && e.Name == "rank 0" {
						n++
					}
				}
				if n < recorded {
					errs <- fmt.Errorf("Stop returned with %d of the %d submissions recorded before it in the file", n, recorded)
				}
			}()
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Errorf("round %d: %v", round, err)
		}
		if err := tl.Stop(); err != nil { // and once more, after everything
			t.Fatal(err)
		}
	}
}

func TestStartErrors(t *testing.T) {
	if _, err := Start("", false); err == nil {
		t.Error("empty path accepted")
	}
	if _, err := Start(filepath.Join(t.TempDir(), "no", "such", "dir", "t.json"), false); err == nil {
		t.Error("unwritable path accepted")
	}
}
