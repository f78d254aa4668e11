//go:build linux

package engine

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kolo-dl/kolo/internal/autotune"
	"github.com/kolo-dl/kolo/internal/dtype"
	"github.com/kolo-dl/kolo/internal/engine/negotiate"
	"github.com/kolo-dl/kolo/internal/transport/inmem"
)

// traceRows reads a trace and returns, per row label, its span events ("B NAME" and "E") and the
// names of its instant events, in file order.
func traceRows(t *testing.T, path string) (spans, instants map[string][]string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var evs []struct {
		Name string         `json:"name"`
		Ph   string         `json:"ph"`
		Pid  int            `json:"pid"`
		Args map[string]any `json:"args"`
	}
	if err := json.Unmarshal(data, &evs); err != nil {
		t.Fatalf("trace is not a JSON array: %v", err)
	}
	label := map[int]string{0: "(global)"}
	spans, instants = map[string][]string{}, map[string][]string{}
	for _, e := range evs {
		switch e.Ph {
		case "M":
			if e.Name == "process_name" {
				label[e.Pid], _ = e.Args["name"].(string)
			}
		case "i":
			instants[label[e.Pid]] = append(instants[label[e.Pid]], e.Name)
		case "B":
			spans[label[e.Pid]] = append(spans[label[e.Pid]], "B "+e.Name)
		case "E":
			spans[label[e.Pid]] = append(spans[label[e.Pid]], "E")
		}
	}
	return spans, instants
}

func TestTimelineOfKnownOps(t *testing.T) {
	c := newCluster(t, 2, DefaultConfig())
	ctx := waitCtx(t)
	path := filepath.Join(t.TempDir(), "timeline.json")
	for _, e := range c.engines {
		if err := e.StartTimeline(path, true); err != nil {
			t.Fatal(err)
		}
	}
	if c.engines[1].tl.Load() != nil {
		t.Fatal("rank 1 records a timeline without {rank} in its path")
	}
	ids := addSets(t, c, []int{1})
	every(t, c, func(r int, e *Engine) error {
		// A group of two allreduces: released together and fused, so the phases are known.
		var hs []*Handle
		for _, name := range []string{"g.a", "g.b"} {
			req := allreduceReq(name, 2)
			req.Group, req.GroupSize = 5, 2
			buf := f32(1, 2)
			hs = append(hs, e.Enqueue(req, buf, buf))
		}
		bc := f32(3)
		hs = append(hs, e.Enqueue(negotiate.Request{Name: "bc", Kind: negotiate.Broadcast, DType: dtype.Float32, Shape: []int64{1}, Root: 1}, bc, bc))
		if r == 1 { // a set without rank 0: rank 0 coordinates it but does not run it
			buf := f32(1)
			hs = append(hs, e.Enqueue(inSetReq(allreduceReq("solo", 1), ids[0]), buf, buf))
		}
		for _, h := range hs {
			if err := h.Wait(ctx); err != nil {
				return err
			}
		}
		return nil
	})
	for _, e := range c.engines {
		if err := e.StopTimeline(); err != nil {
			t.Fatal(err)
		}
	}
	spans, instants := traceRows(t, path)
	fusedAllreduce := []string{"B NEGOTIATE_ALLREDUCE", "E", "B ALLREDUCE", "B QUEUE", "E", "B MEMCPY_IN_FUSION_BUFFER", "E",
		"B KOLO_ALLREDUCE", "E", "B MEMCPY_OUT_FUSION_BUFFER", "E", "E"}
	for _, name := range []string{"g.a", "g.b"} {
		if !slices.Equal(spans[name], fusedAllreduce) {
			t.Errorf("%s: %v\nwant %v", name, spans[name], fusedAllreduce)
		}
		if got := slices.Sorted(slices.Values(instants[name])); !slices.Equal(got, []string{"rank 0", "rank 1"}) {
			t.Errorf("%s: instants %v, want each rank's submission", name, got)
		}
	}
	if want := []string{"B NEGOTIATE_BROADCAST", "E", "B BROADCAST", "B QUEUE", "E", "B KOLO_BROADCAST", "E", "E"}; !slices.Equal(spans["bc"], want) {
		t.Errorf("bc: %v\nwant %v", spans["bc"], want)
	}
	solo := "solo (process set 1)"
	if want := []string{"B NEGOTIATE_ALLREDUCE", "E"}; !slices.Equal(spans[solo], want) || !slices.Equal(instants[solo], []string{"rank 1"}) {
		t.Errorf("%s: %v %v", solo, spans[solo], instants[solo])
	}
	if !slices.Contains(instants["(global)"], "CYCLE_START") {
		t.Error("no cycle markers")
	}
}

// With {rank} in the path every rank records its own file, and tensors a rank runs show up there.
func TestTimelinePerRank(t *testing.T) {
	c := newCluster(t, 2, DefaultConfig())
	ctx := waitCtx(t)
	dir := t.TempDir()
	for _, e := range c.engines {
		if err := e.StartTimeline(filepath.Join(dir, "tl.{rank}.json"), false); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	for _, e := range c.engines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := f32(1)
			if err := e.Enqueue(allreduceReq("w", 1), buf, buf).Wait(ctx); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	for r, e := range c.engines {
		if err := e.StopTimeline(); err != nil {
			t.Fatal(err)
		}
		spans, _ := traceRows(t, filepath.Join(dir, "tl."+string(rune('0'+r))+".json"))
		if !slices.Contains(spans["w"], "B KOLO_ALLREDUCE") {
			t.Errorf("rank %d's trace: %v", r, spans)
		}
		if strings.Contains(strings.Join(spans["(global)"], ","), "CYCLE") {
			t.Errorf("rank %d marked cycles", r)
		}
	}
}

// Starting the timeline again on the file it is writing (hvd.start_timeline twice), also from
// several goroutines and racing StopTimeline: the old recording's last write must not land in the
// new file, and each call returns once its work is done.
func TestTimelineRestartOnSameFile(t *testing.T) {
	c := newCluster(t, 1, DefaultConfig())
	e := c.engines[0]
	ctx := waitCtx(t)
	path := filepath.Join(t.TempDir(), "timeline.json")
	for round := range 5 {
		if err := e.StartTimeline(path, true); err != nil {
			t.Fatal(err)
		}
		// Records the writer has not flushed yet (it writes every 100 ms) when the restart comes.
		for i := range 50 {
			buf := f32(1)
			if err := e.Enqueue(allreduceReq(fmt.Sprintf("old%d.%d", round, i), 1), buf, buf).Wait(ctx); err != nil {
				t.Fatal(err)
			}
		}
		var wg sync.WaitGroup
		for range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := e.StartTimeline(path, false); err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		buf := f32(1)
		if err := e.Enqueue(allreduceReq("new", 1), buf, buf).Wait(ctx); err != nil {
			t.Fatal(err)
		}
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := e.StopTimeline(); err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		spans, _ := traceRows(t, path)
		if !slices.Contains(spans["new"], "B KOLO_ALLREDUCE") {
			t.Fatalf("round %d: the restarted trace lacks the op recorded after the restart: %v", round, spans)
		}
	}
}

// BenchmarkTimelineOverhead is BenchmarkBlockingAllreduce (no spinning) with the timeline off and
// on: what recording costs per op.
func BenchmarkTimelineOverhead(b *testing.B) {
	for _, on := range []bool{false, true} {
		b.Run(map[bool]string{false: "off", true: "on"}[on], func(b *testing.B) {
			c := newShmCluster(b, 2, DefaultConfig())
			if on {
				if err := c.engines[0].StartTimeline(filepath.Join(b.TempDir(), "t.json"), true); err != nil {
					b.Fatal(err)
				}
				defer c.engines[0].StopTimeline()
			}
			benchAllreduces(b, c)
		})
	}
}

// Rank 0's timeline marks every sample the autotuner timed, as its log has it, and every switch of
// the settings.
func TestTimelineMarksEveryAutotuneSample(t *testing.T) {
	log := filepath.Join(t.TempDir(), "at.csv")
	path := filepath.Join(t.TempDir(), "timeline.json")
	cfg := DefaultConfig()
	cfg.Autotune = AutotuneConfig{Enabled: true, LogFile: log, WarmupSamples: 1, StepsPerSample: 1, MaxSamples: 7}
	cfg.Timeline = path
	c := newClusterWith(t, 2, cfg, []inmem.Option{inmem.WithoutShared()}, nil)
	ctx := waitCtx(t)
	every(t, c, func(r int, e *Engine) error {
		for range 40 {
			buf := f32(1)
			if err := e.Enqueue(allreduceReq("g", 1), buf, buf).Wait(ctx); err != nil {
				return err
			}
			e.MarkStep()
		}
		return nil
	})
	if rep := c.engines[0].AutotuneReport(); !strings.Contains(rep, "decided at step") {
		t.Fatalf("the tuner did not decide: %q", rep)
	}
	if err := c.engines[0].StopTimeline(); err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, row := range logRows(t, log) {
		if row.Settings[autotune.ColumnPhase] != autotune.PhaseDecided {
			want = append(want, fmt.Sprintf("AUTOTUNE sample %d (steps %d-%d)", row.Sample, row.Step, row.Step))
		}
	}
	_, instants := traceRows(t, path)
	var got []string
	switches := 0
	for _, name := range instants["(global)"] {
		if strings.HasPrefix(name, "AUTOTUNE sample ") {
			got = append(got, name[:strings.Index(name, ")")+1])
		}
		if strings.HasPrefix(name, "AUTOTUNE step ") {
			switches++
		}
	}
	if len(want) < 4 || !slices.Equal(got, want) {
		t.Errorf("sample marks %q\nwant, from the log, %q", got, want)
	}
	if switches < 2 {
		t.Errorf("%d switches marked; the tuner alternated candidates with the defaults", switches)
	}
}
