package engine

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/autotune"
	"github.com/kolo-dl/kolo/internal/autotune/csvlog"
	"github.com/kolo-dl/kolo/internal/engine/negotiate"
	"github.com/kolo-dl/kolo/internal/transport/inmem"
)

// scriptTuner is a tuner that asks for fixed settings at fixed steps and decides at done.
type scriptTuner struct {
	at   map[int64]autotune.Settings // step it decides at -> settings, from step+2
	done int64
	last int64
}

func (s *scriptTuner) Step(step int64, now time.Time) (autotune.Settings, int64, bool) {
	s.last = step
	st, ok := s.at[step]
	return st, step + 2, ok
}
func (s *scriptTuner) Done() bool { return s.last >= s.done }
func (s *scriptTuner) Result() autotune.Result {
	return autotune.Result{Decided: s.last >= s.done, Chosen: s.at[3], Speedup: 1.07, Low: 1.04, High: 1.1, DecidedAt: s.last}
}
func (s *scriptTuner) Close() error                      { return nil }
func (s *scriptTuner) TakeSamples() []autotune.SampleEnd { return nil }

// scriptSteps gives rank 0 of c a tuner that asks for at's settings at its steps and decides at
// step 11, then runs steps steps on every rank: step's ops, then MarkStep. Rank 2 runs behind, as
// a slow rank does. It fails the test with the first rank's error.
func scriptSteps(t *testing.T, c *cluster, at map[int64]autotune.Settings, steps int, step func(ctx context.Context, r, s int) error) {
	t.Helper()
	e0 := c.engines[0]
	e0.tune.mu.Lock()
	e0.tune.tuner = &scriptTuner{at: at, done: 11}
	e0.tune.mu.Unlock()
	ctx := waitCtx(t)
	var wg sync.WaitGroup
	errs := make([]error, len(c.engines))
	for r := range c.engines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for s := 1; s <= steps; s++ {
				if r == 2 {
					time.Sleep(3 * time.Millisecond)
				}
				if errs[r] = step(ctx, r, s); errs[r] != nil {
					return
				}
				c.engines[r].MarkStep()
			}
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}

// The settings rank 0's tuner asks for come into force on every rank at the step it names, not
// when its message arrives, and the job's results do not change with them.
func TestTunedSettingsSwitchAtOneStepOnEveryRank(t *testing.T) {
	const n, steps = 3, 14
	captureLog(t)
	c := newClusterWith(t, n, DefaultConfig(), []inmem.Option{inmem.WithoutShared()}, nil)
	// a also spins longer, which every rank does from its step on; b leaves the spin as it is.
	a := autotune.Settings{FusionBytes: 1 << 20, CycleTime: 2 * time.Millisecond, SpinTime: 300 * time.Microsecond}
	b := autotune.Settings{FusionBytes: 0, CycleTime: 0}
	e0 := c.engines[0]
	scriptSteps(t, c, map[int64]autotune.Settings{3: a, 8: b}, steps, func(ctx context.Context, r, s int) error {
		for i := range 3 {
			buf := f32(float32(r + 1))
			if err := c.engines[r].Enqueue(allreduceReq(fmt.Sprintf("g%d", i), 1), buf, buf).Wait(ctx); err != nil {
				return err
			}
			if got := getF32(buf)[0]; got != 6 {
				return fmt.Errorf("step %d: sum %v, want 6", s, got)
			}
		}
		return nil
	})
	want := []appliedSettings{
		{Step: 5, Wanted: 5, FusionBytes: a.FusionBytes, CycleTime: a.CycleTime, SpinTime: a.SpinTime},
		{Step: 10, Wanted: 10, FusionBytes: b.FusionBytes, CycleTime: b.CycleTime, SpinTime: a.SpinTime},
	}
	for r := range n {
		got := c.engines[r].appliedSteps()
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("rank %d applied %+v, want %+v", r, got, want)
		}
	}
	if got := c.engines[1].tune.cycle.Load(); got != 0 {
		t.Errorf("rank 1's cycle time after the last switch: %v", time.Duration(got))
	}
	for r := range n {
		if got := c.engines[r].spinTime(); got != a.SpinTime {
			t.Errorf("rank %d spins for %v after the last switch, want %v", r, got, a.SpinTime)
		}
	}
	if r := e0.AutotuneReport(); !strings.Contains(r, "1.07x the defaults' steps/s") {
		t.Errorf("rank 0's report %q", r)
	}
	if r := c.engines[1].AutotuneReport(); r != "" {
		t.Errorf("rank 1 reports %q; only rank 0 tunes", r)
	}
}

// The collective settings rank 0's tuner asks for come into force on every rank at one place of
// the response stream (a Retune), so that every op runs under the same algorithm everywhere: a
// rank that switched one op earlier than another would run recursive doubling against the shared
// slots, or slot rounds of different sizes, and hang or corrupt the sum. Over shared slots, with
// ops on both sides of each threshold, and a rank that runs behind.
func TestTunedCollectivesSwitchAtOneResponseOnEveryRank(t *testing.T) {
	const n, steps = 4, 14
	captureLog(t)
	c := newClusterWith(t, n, DefaultConfig(), []inmem.Option{inmem.WithSlotBytes(256 << 10)}, nil)
	// a: everything over the slots, in rounds of 4 KiB; b: recursive doubling up to 1 MiB, then
	// the job's own rounds.
	a := autotune.Settings{FusionBytes: 1 << 20, SmallAllreduceBytes: 8, SharedRoundBytes: 4 << 10, Hierarchical: autotune.Off}
	b := autotune.Settings{FusionBytes: 0, SmallAllreduceBytes: 1 << 20, Hierarchical: autotune.Off}
	sizes := []int{1, 300, 20_000} // 4 B, 1.2 KB, 80 KB
	scriptSteps(t, c, map[int64]autotune.Settings{3: a, 8: b}, steps, func(ctx context.Context, r, s int) error {
		for i, size := range sizes {
			vals := make([]float32, size)
			for j := range vals {
				vals[j] = float32(r + 1 + j%7)
			}
			buf := f32(vals...)
			if err := c.engines[r].Enqueue(allreduceReq(fmt.Sprintf("g%d", i), size), buf, buf).Wait(ctx); err != nil {
				return fmt.Errorf("step %d: %w", s, err)
			}
			for j, got := range getF32(buf) {
				if want := float32(10 + 4*(j%7)); got != want {
					return fmt.Errorf("step %d, %d floats: element %d is %v, want %v", s, size, j, got, want)
				}
			}
		}
		return nil
	})
	want := []negotiate.Collectives{
		{SmallAllreduceBytes: 8, SharedRoundBytes: 4 << 10},
		{SmallAllreduceBytes: 1 << 20},
	}
	first := c.engines[0].retunes()
	for r := range n {
		got := c.engines[r].retunes()
		if len(got) != len(want) {
			t.Fatalf("rank %d executed retunes %+v, want %+v", r, got, want)
		}
		for i := range got {
			if got[i].Collectives != want[i] || got[i].Seq != first[i].Seq {
				t.Errorf("rank %d: retune %d is %+v at response %d; rank 0's is at response %d, want %+v",
					r, i, got[i].Collectives, got[i].Seq, first[i].Seq, want[i])
			}
		}
		if x := c.engines[r].global.exec; x.tun.SmallAllreduceBytes != 1<<20 || x.tun.SharedRoundBytes != 0 || x.cfg.Hierarchical {
			t.Errorf("rank %d's executor after the last retune: %+v, hierarchical %v", r, x.tun, x.cfg.Hierarchical)
		}
	}
}

// KOLO_SMALL_ALLREDUCE_BYTES and KOLO_SHM_ROUND_BYTES are rank 0's: a rank given other values (its
// own environment under mpirun) runs rank 0's algorithms from the first op, where with its own it
// would run recursive doubling against the others' shared slots and hang.
func TestCollectiveKnobsAreRankZeros(t *testing.T) {
	const n = 3
	eps := inmem.New(n, inmem.WithSlotBytes(256<<10))
	groups := make([]Group, n)
	cfgs := make([]Config, n)
	for r, ep := range eps {
		groups[r] = Group{Comm: ep.Comm(), Messenger: ep, Local: ep.Comm()}
		cfgs[r] = DefaultConfig()
		cfgs[r].ProgressTimeout = 5 * time.Second
		cfgs[r].SmallAllreduceBytes = 1 << 20 // recursive doubling for everything below
	}
	cfgs[0].SmallAllreduceBytes, cfgs[0].SharedRoundBytes = 8, 4<<10 // the slots, in 4 KiB rounds
	c := startClusterEach(t, cfgs, "memhost", groups, func() {
		for _, ep := range eps {
			ep.Close()
		}
	})
	ctx := waitCtx(t)
	every(t, c, func(r int, e *Engine) error {
		for i := range 3 {
			vals := make([]float32, 20_000)
			for j := range vals {
				vals[j] = float32(r + j%5)
			}
			buf := f32(vals...)
			if err := e.Enqueue(allreduceReq(fmt.Sprintf("x%d", i), len(vals)), buf, buf).Wait(ctx); err != nil {
				return err
			}
			for j, got := range getF32(buf) {
				if want := float32(3 + 3*(j%5)); got != want {
					return fmt.Errorf("op %d: element %d is %v, want %v", i, j, got, want)
				}
			}
		}
		return nil
	})
	for r, e := range c.engines {
		got := e.retunes()
		want := negotiate.Collectives{SmallAllreduceBytes: 8, SharedRoundBytes: 4 << 10, Hierarchical: true}
		if len(got) != 1 || got[0].Seq != 1 || got[0].Collectives != want {
			t.Errorf("rank %d executed retunes %+v, want one at response 1 with %+v", r, got, want)
		}
		if x := e.global.exec; x.tun.SmallAllreduceBytes != 8 || x.tun.SharedRoundBytes != 4<<10 {
			t.Errorf("rank %d runs %+v", r, x.tun)
		}
	}
}

// autotuneRound runs one round of an elastic job with autotuning on: n engines of round `round`
// that log to log, steps data-parallel steps (an allreduce, then MarkStep, on every rank), and the
// round's end as kolo.Init's reset does it (AutotuneReport, which closes the log). It returns the
// engines and rank 0's report.
func autotuneRound(t *testing.T, n, round, steps int, log string) (*cluster, string) {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Autotune = AutotuneConfig{Enabled: true, LogFile: log, WarmupSamples: 1, StepsPerSample: 1, MaxSamples: 7, Round: round}
	c := newClusterWith(t, n, cfg, []inmem.Option{inmem.WithoutShared()}, nil)
	ctx := waitCtx(t)
	var wg sync.WaitGroup
	errs := make([]error, n)
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range steps {
				buf := f32(1)
				if err := c.engines[r].Enqueue(allreduceReq("g", 1), buf, buf).Wait(ctx); err != nil {
					errs[r] = err
					return
				}
				c.engines[r].MarkStep()
			}
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("round %d, rank %d: %v", round, r, err)
		}
	}
	for r := 1; r < n; r++ {
		if rep := c.engines[r].AutotuneReport(); rep != "" {
			t.Errorf("round %d: rank %d reports %q", round, r, rep)
		}
	}
	return c, c.engines[0].AutotuneReport()
}

// logRows reads the autotune log at path.
func logRows(t *testing.T, path string) []csvlog.Row {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	l, err := csvlog.Read(f)
	if err != nil {
		b, _ := os.ReadFile(path)
		t.Fatalf("%v\n%s", err, b)
	}
	return l.Rows
}

// Under elastic training every round is a new engine, and rank 0 of each round tunes for its own
// world: the rows of every round go to one log, tagged with the round and world; a round that ends
// undecided says so for its round; a decision is read back by a later round of the same world only,
// and then every rank switches to it at the same step.
func TestAutotuneAcrossElasticRounds(t *testing.T) {
	captureLog(t)
	log := filepath.Join(t.TempDir(), "autotune.csv")

	_, rep := autotuneRound(t, 3, 1, 6, log)
	if !strings.HasPrefix(rep, "autotune, round 1, 3 ranks on 1 host: the round ended before a decision") {
		t.Errorf("round 1 reports %q", rep)
	}
	_, rep = autotuneRound(t, 2, 2, 80, log)
	if !strings.HasPrefix(rep, "autotune, round 2, 2 ranks on 1 host: ") || !strings.Contains(rep, "decided at step") {
		t.Errorf("round 2 reports %q", rep)
	}
	rows := logRows(t, log)
	perRound := map[string]int{}
	for _, row := range rows {
		perRound[row.Settings[autotune.ColumnRound]+"/"+row.Settings[autotune.ColumnRanks]]++
	}
	last := rows[len(rows)-1]
	if perRound["1/3"] == 0 || perRound["2/2"] == 0 || len(perRound) != 2 || last.Role != csvlog.Chosen || last.Settings[autotune.ColumnRound] != "2" {
		t.Errorf("rows per round/ranks %v, last %+v", perRound, last)
	}
	decided, err := autotune.ParseSettings(last.Settings)
	if err != nil {
		t.Fatal(err)
	}

	// A world of 3 again: nothing was decided for it, so round 3 tunes, appending.
	_, rep = autotuneRound(t, 3, 3, 4, log)
	if !strings.HasPrefix(rep, "autotune, round 3, 3 ranks on 1 host: the round ended before a decision") {
		t.Errorf("round 3 reports %q", rep)
	}
	if got := logRows(t, log); len(got) <= len(rows) || got[len(rows)-1].Role != csvlog.Chosen || got[len(got)-1].Settings[autotune.ColumnRound] != "3" {
		t.Errorf("round 3 did not append its rows after round 2's decision: %d rows, then %d", len(rows), len(got))
	}

	// A world of 2 again: round 4 starts with round 2's decision, on every rank at step 3.
	c, rep := autotuneRound(t, 2, 4, 5, log)
	if want := "autotune, round 4, 2 ranks on 1 host: used the settings decided for round 2, 2 ranks on 1 host"; !strings.HasPrefix(rep, want) {
		t.Errorf("round 4 reports %q, want %q...", rep, want)
	}
	want := fmt.Sprint([]appliedSettings{{Step: 3, Wanted: 3, FusionBytes: decided.FusionBytes, CycleTime: decided.CycleTime, Cache: negotiate.CacheOn}}) // the cache is on in these jobs: a searched knob
	for r, e := range c.engines {
		if got := fmt.Sprint(e.appliedSteps()); got != want {
			t.Errorf("round 4, rank %d applied %s, want %s", r, got, want)
		}
	}
}

// A log that is empty, or that a job which decided nothing left, is started afresh outside elastic
// jobs; one that is not an autotune log stops the job's start with an error naming it.
func TestAutotuneLogStart(t *testing.T) {
	captureLog(t)
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.csv")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	autotuneRound(t, 2, 0, 3, empty)
	if b, _ := os.ReadFile(empty); !strings.HasPrefix(string(b), csvlog.Comment) {
		t.Errorf("the empty log was not started: %q", b)
	}
	autotuneRound(t, 2, 0, 3, empty) // undecided: replaced, one header
	if b, _ := os.ReadFile(empty); strings.Count(string(b), csvlog.Comment) != 1 {
		t.Errorf("an undecided log was appended to, not replaced:\n%s", b)
	}
	bad := filepath.Join(dir, "bad.csv")
	if err := os.WriteFile(bad, []byte("not a log\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Autotune = AutotuneConfig{Enabled: true, LogFile: bad}
	eps := inmem.New(1)
	t.Cleanup(func() { eps[0].Close() })
	if e, err := New(cfg, Group{Rank: 0, Size: 1, Comm: eps[0].Comm(), Messenger: eps[0], Local: eps[0].Comm(), Hosts: []string{"h"}, LocalRanks: []int{0}}); err == nil || !strings.Contains(err.Error(), bad) {
		t.Errorf("New with a log that is not one: %v", err)
		if e != nil {
			e.Shutdown(context.Background())
		}
	}
}

// Process sets keep the collective settings in force where the global stream created them: a set
// made before a Retune runs the job's algorithms to the end, one made after it the retuned ones,
// the same on every member (each copies the global executor's settings at the AddProcessSet
// response, which every rank executes at the same place of the global stream). Were a member to
// take other settings, recursive doubling would meet the ring in the set's allreduces: a hang or
// a wrong sum. Ops in both sets and the global set every step, across two retunes.
func TestRetunesAndProcessSets(t *testing.T) {
	const n, steps = 4, 12
	captureLog(t)
	// A member running other algorithms than the rest would wait for bytes that never come: the
	// progress deadline fails it in seconds instead of at the package's timeout.
	c := newClusterWith(t, n, DefaultConfig(), []inmem.Option{inmem.WithSlotBytes(256 << 10), inmem.WithProgressTimeout(5 * time.Second)}, nil)
	// a (from step 5): the ring above 8 bytes; b (from step 10): recursive doubling up to 1 MiB.
	a := autotune.Settings{FusionBytes: 1 << 20, SmallAllreduceBytes: 8, SharedRoundBytes: 4 << 10, Hierarchical: autotune.Off}
	b := autotune.Settings{FusionBytes: 0, SmallAllreduceBytes: 1 << 20, Hierarchical: autotune.Off}
	members := map[string][]int{"early": {1, 2, 3}, "late": {0, 2, 3}}
	created := map[string]int{"early": 1, "late": 7} // the step that adds the set
	ids := make([]map[string]int, n)
	for r := range ids {
		ids[r] = map[string]int{}
	}
	sizes := []int{1, 300, 20_000}
	allreduce := func(ctx context.Context, e *Engine, set int, name string, ranks []int, r int) error {
		for i, size := range sizes {
			vals := make([]float32, size)
			for j := range vals {
				vals[j] = float32(r + 1 + j%7)
			}
			buf := f32(vals...)
			req := allreduceReq(fmt.Sprintf("%s%d", name, i), size)
			req.Set = set
			if err := e.Enqueue(req, buf, buf).Wait(ctx); err != nil {
				return fmt.Errorf("%s, %d floats: %w", name, size, err)
			}
			var base float32
			for _, m := range ranks {
				base += float32(m + 1)
			}
			for j, got := range getF32(buf) {
				if want := base + float32(len(ranks)*(j%7)); got != want {
					return fmt.Errorf("%s, %d floats: element %d is %v, want %v", name, size, j, got, want)
				}
			}
		}
		return nil
	}
	scriptSteps(t, c, map[int64]autotune.Settings{3: a, 8: b}, steps, func(ctx context.Context, r, s int) error {
		e := c.engines[r]
		for _, name := range []string{"early", "late"} {
			if s == created[name] {
				id, err := e.AddProcessSet(ctx, members[name])
				if err != nil {
					return fmt.Errorf("step %d: add the %s set: %w", s, name, err)
				}
				ids[r][name] = id
			}
		}
		if err := allreduce(ctx, e, 0, fmt.Sprintf("g.%d.", s), []int{0, 1, 2, 3}, r); err != nil {
			return fmt.Errorf("step %d: %w", s, err)
		}
		for _, name := range []string{"early", "late"} {
			id, ok := ids[r][name]
			if !ok || !slices.Contains(members[name], r) {
				continue
			}
			if err := allreduce(ctx, e, id, fmt.Sprintf("%s.%d.", name, s), members[name], r); err != nil {
				return fmt.Errorf("step %d: %w", s, err)
			}
		}
		return nil
	})
	for r, e := range c.engines {
		for name, want := range map[string]int{"early": 0, "late": 8} {
			if !slices.Contains(members[name], r) {
				continue
			}
			if got := e.sets[ids[r][name]].exec.tun.SmallAllreduceBytes; got != want {
				t.Errorf("rank %d: the %s set runs with small allreduce %d bytes, want %d", r, name, got, want)
			}
		}
		if got := e.global.exec.tun.SmallAllreduceBytes; got != 1<<20 {
			t.Errorf("rank %d: the global set runs with small allreduce %d bytes, want 1 MiB", r, got)
		}
	}
}

// The response cache the tuner turns off comes off at rank 0's step: from the step after, no rank
// sends an op as a cache id (each rank dropped its entries where the coordinator's responses
// evicted them), in the global set and in a process set alike, and it comes back on at the step
// the tuner names; every result stays right through both switches, with a rank running behind.
func TestTunedResponseCacheSwitch(t *testing.T) {
	const n, steps = 3, 14
	captureLog(t)
	c := newClusterWith(t, n, DefaultConfig(), []inmem.Option{inmem.WithoutShared()}, nil)
	off := autotune.Settings{FusionBytes: 64 << 20, ResponseCache: autotune.Off} // from step 5 (after 5 marks)
	on := autotune.Settings{FusionBytes: 64 << 20, ResponseCache: autotune.On}   // from step 10
	var mu sync.Mutex
	ids := make([][]uint64, n) // per rank, per step: ops sent as cache ids
	set := make([]int, n)
	scriptSteps(t, c, map[int64]autotune.Settings{3: off, 8: on}, steps, func(ctx context.Context, r, s int) error {
		e := c.engines[r]
		if s == 1 {
			id, err := e.AddProcessSet(ctx, []int{0, 2})
			if err != nil {
				return err
			}
			set[r] = id
		}
		_, before := e.Requests()
		for i := range 3 {
			buf := f32(float32(r+1), float32(i))
			if err := e.Enqueue(allreduceReq(fmt.Sprintf("g%d", i), 2), buf, buf).Wait(ctx); err != nil {
				return fmt.Errorf("step %d: %w", s, err)
			}
			if got := getF32(buf); got[0] != 6 || got[1] != float32(3*i) {
				return fmt.Errorf("step %d: sum %v, want [6 %d]", s, got, 3*i)
			}
		}
		if r != 1 {
			req := allreduceReq("pair", 1)
			req.Set = set[r]
			buf := f32(float32(r + 1))
			if err := e.Enqueue(req, buf, buf).Wait(ctx); err != nil {
				return fmt.Errorf("step %d, the process set: %w", s, err)
			}
			if got := getF32(buf)[0]; got != 4 {
				return fmt.Errorf("step %d, the process set: sum %v, want 4", s, got)
			}
		}
		_, after := e.Requests()
		mu.Lock()
		ids[r] = append(ids[r], after-before)
		mu.Unlock()
		return nil
	})
	ops := []uint64{4, 3, 4} // per rank, a step's ops
	for r := range n {
		for s, got := range ids[r] {
			step := s + 1
			switch {
			case step >= 2 && step <= 5 || step >= 12:
				// The cache is on and the step's ops were all answered before.
				if got != ops[r] {
					t.Errorf("rank %d, step %d: %d ops sent as ids, want all %d (the cache on)", r, step, got, ops[r])
				}
			case step >= 7 && step <= 10:
				if got != 0 {
					t.Errorf("rank %d, step %d: %d ops sent as ids with the cache off", r, step, got)
				}
			}
		}
		applied := c.engines[r].appliedSteps()
		if len(applied) != 2 || applied[0].Cache != negotiate.CacheOff || applied[1].Cache != negotiate.CacheOn {
			t.Errorf("rank %d applied %+v, want the cache off, then on", r, applied)
		}
	}
	t.Logf("ops sent as ids per step: %v", ids)
}

// appliedSteps returns the tuned settings that came into force on this rank, in order.
func (e *Engine) appliedSteps() []appliedSettings {
	e.tune.mu.Lock()
	defer e.tune.mu.Unlock()
	return slices.Clone(e.tune.applied)
}

// retunes returns the Retune responses this rank executed, in order.
func (e *Engine) retunes() []appliedCollectives {
	e.tune.mu.Lock()
	defer e.tune.mu.Unlock()
	return slices.Clone(e.tune.retuned)
}
