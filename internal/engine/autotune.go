package engine

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kolo-dl/kolo/internal/autotune"
	"github.com/kolo-dl/kolo/internal/autotune/csvlog"
	"github.com/kolo-dl/kolo/internal/collective"
	"github.com/kolo-dl/kolo/internal/engine/negotiate"
	"github.com/kolo-dl/kolo/internal/transport"
)

// The autotuner's side of the engine. Rank 0 runs the tuner (package autotune) on the steps the
// program marks; whatever it wants in force it sends every rank as a Settings message naming the
// first step it applies to, and each rank switches when its own step count reaches that step.
// A step number, not the message's arrival, decides, so that every rank runs each step under the
// same settings: a rank of a data-parallel job is never more than one step ahead of rank 0 (each
// step's allreduce needs rank 0's gradients), and the message, sent before rank 0 submits its
// next step's ops, travels ahead of the responses that step needs, so it is in with Lag >= 2.

// tuning is an engine's tunable settings and, on rank 0 with autotuning on, its tuner.
type tuning struct {
	steps atomic.Int64 // steps MarkStep has counted
	// cycle is the cycle time in force (nanoseconds), which the driver reads at every step.
	cycle atomic.Int64
	// spin is how long this rank's waits poll before they sleep now (nanoseconds; Config.Spin at
	// first), which every wait reads as it starts.
	spin atomic.Int64
	// fusion is a fusion threshold for the driver to hand the Hub (rank 0), or -1: none waiting.
	fusion atomic.Int64
	// cache is a response-cache switch for the driver to hand the Hub (rank 0), or
	// CacheUnchanged: none waiting.
	cache atomic.Uint32
	// retune is collective settings for the driver to hand the Hub (rank 0), or nil: none
	// waiting. The Hub sends them as a Retune response, which every rank applies where it meets it
	// in the response stream.
	retune atomic.Pointer[negotiate.Collectives]
	// colls are the collective settings rank 0 last asked the Hub for (the job's own at first).
	colls negotiate.Collectives

	mu      sync.Mutex
	pending []negotiate.Settings // received, not in force yet (From > steps)
	applied []appliedSettings    // what came into force, at which step
	retuned []appliedCollectives // Retune responses executed, in order
	tuner   stepTuner            // rank 0 with autotuning on; nil once it decided
	logFile *os.File
	result  *autotune.Result // the decision, once taken (rank 0)
	world   autotune.World   // the world tuned for (rank 0)
	// reused is an earlier run's (or round's) decision that rank 0 took from the log instead of
	// tuning, made in world reusedIn; toSend says every rank still has to be told it.
	reused   *autotune.Settings
	reusedIn autotune.World
	toSend   bool
	buf      []byte
}

// stepTuner is what the engine needs of an *autotune.Tuner (tests script one).
type stepTuner interface {
	Step(step int64, now time.Time) (s autotune.Settings, from int64, change bool)
	Done() bool
	TakeSamples() []autotune.SampleEnd
	Result() autotune.Result
	Close() error
}

// appliedSettings is a change of the tuned settings that came into force on this rank.
type appliedSettings struct {
	Step        int64 // the first step run under them
	Wanted      int64 // the step rank 0 named (Step > Wanted: the message came late)
	FusionBytes int64
	CycleTime   time.Duration
	SpinTime    time.Duration // how long this rank's waits poll from then on
	// Cache is the response cache's switch in the message (negotiate.CacheUnchanged: left as it
	// was); only rank 0's coordinator acts on it.
	Cache negotiate.CacheSwitch
}

// appliedCollectives is a Retune response that this rank executed: the collective settings every
// rank runs the responses after it under.
type appliedCollectives struct {
	Seq  uint64 // the Retune's place in the global set's response stream
	Step int64  // this rank's step count when it executed it
	negotiate.Collectives
}

// collectiveDefaults are the collective knobs, at this job's values, that can matter in this world:
// the autotuner searches those (autotune.Settings). The small-allreduce threshold whenever there
// are peers; the shared-memory round where ranks of this host share memory and each has a CPU
// (with more ranks than CPUs a round is the whole slot, whatever the setting); hierarchical
// allreduce where it would run: several hosts, each with the same number of several ranks; the
// spin time where this rank's waits poll (Config.Spin > 0, which kolo.Init's default is only where
// every local rank has a CPU: polling otherwise steals the awaited rank's core).
func (e *Engine) collectiveDefaults(cfg Config) autotune.Settings {
	var s autotune.Settings
	if e.g.Size < 2 {
		return s
	}
	s.SmallAllreduceBytes = cmp.Or(cfg.SmallAllreduceBytes, collective.DefaultSmallAllreduceBytes)
	if sh, ok := e.g.Local.(transport.Shared); ok && e.g.Local.Size() > 1 && len(sh.Slot(0)) > 0 && !sh.Oversubscribed() {
		s.SharedRoundBytes = cmp.Or(cfg.SharedRoundBytes, collective.DefaultSharedRoundBytes)
	}
	if e.g.Cross != nil && e.g.Local != nil && e.g.Local.Size() > 1 && len(e.g.LocalRanks) < e.g.Size {
		s.Hierarchical = autotune.SwitchOf(cfg.Hierarchical)
	}
	if cfg.Spin > 0 {
		s.SpinTime = cfg.Spin
	}
	if cfg.CacheCapacity > 0 {
		s.ResponseCache = autotune.On // a job that disabled the cache keeps it off
	}
	return s
}

// cacheSwitch is the Settings message's response-cache switch for s: unchanged in a job that
// disabled the cache, which keeps it off (a decision read back from a log may say "on").
func (e *Engine) cacheSwitch(s autotune.Settings) negotiate.CacheSwitch {
	switch {
	case e.cfg.CacheCapacity <= 0:
	case s.ResponseCache == autotune.Off:
		return negotiate.CacheOff
	case s.ResponseCache == autotune.On:
		return negotiate.CacheOn
	}
	return negotiate.CacheUnchanged
}

// spinTime is how long this rank's waits poll before they sleep now (<= 0: never).
func (e *Engine) spinTime() time.Duration { return time.Duration(e.tune.spin.Load()) }

// setSpin has this rank's waits poll for d from their next wait on: the engine's own and, on a
// transport that can change it, the shared-memory ones. Only this rank's pacing changes, so unlike
// the collective knobs it needs no agreement beyond the step every rank switches at.
func (e *Engine) setSpin(d time.Duration) {
	e.tune.spin.Store(int64(d))
	if sp, ok := e.g.Local.(transport.Spinner); ok { // the host's shared memory, messenger included
		sp.SetSpin(d)
	}
}

// collectivesOf are the collective settings s brings into force; the knobs s leaves unset keep the
// job's own (cfg's).
func collectivesOf(s autotune.Settings, cfg Config) negotiate.Collectives {
	c := negotiate.Collectives{SmallAllreduceBytes: cmp.Or(s.SmallAllreduceBytes, cfg.SmallAllreduceBytes),
		SharedRoundBytes: cmp.Or(s.SharedRoundBytes, cfg.SharedRoundBytes), Hierarchical: cfg.Hierarchical}
	if s.Hierarchical != autotune.Unset {
		c.Hierarchical = s.Hierarchical == autotune.On
	}
	return c
}

// initTuning sets the settings in force from cfg and, on rank 0 with autotuning on, starts the
// tuner: from the log's decision for a world like this one if cfg names a log that has it (the job
// then starts tuned), else from scratch with cfg's settings as the defaults it must beat.
//
// In an elastic job every round is a new engine, and rank 0 of each round (perhaps another
// process than the last round's) does this anew: it reads what the earlier rounds wrote, takes a
// decision made for a world of the same ranks and hosts, and otherwise tunes for its own world,
// from the job's own settings, appending its rows, tagged with the round, to the same log.
func (e *Engine) initTuning(cfg Config) error {
	e.tune.cycle.Store(int64(cfg.CycleTime))
	e.tune.spin.Store(int64(cfg.Spin))
	e.tune.fusion.Store(-1)
	e.tune.colls = negotiate.Collectives{SmallAllreduceBytes: cfg.SmallAllreduceBytes, SharedRoundBytes: cfg.SharedRoundBytes, Hierarchical: cfg.Hierarchical}
	at := cfg.Autotune
	if !at.Enabled || e.g.Rank != 0 {
		return nil
	}
	t := &e.tune
	t.world = autotune.World{Round: at.Round, Ranks: e.g.Size, Hosts: countHosts(e.g.Hosts)}
	defaults := e.collectiveDefaults(cfg)
	defaults.FusionBytes, defaults.CycleTime = max(cfg.FusionBytes, 0), cfg.CycleTime // negative: never fuse, the tuner's 0
	t.colls = collectivesOf(defaults, cfg)                                            // what every executor runs now, in the tuner's terms
	appendLog := false
	if at.LogFile != "" {
		l, err := readLog(at.LogFile)
		switch {
		case err != nil && at.Round > 1:
			// A later round must not fail the job over its log: it tunes without one.
			slog.Warn("autotune: the log is unreadable; this round tunes without writing it", "log", at.LogFile, "round", at.Round, "err", err)
			at.LogFile = ""
		case err != nil:
			return fmt.Errorf("autotune: read %s: %w", at.LogFile, err)
		case l != nil:
			s, w, derr := autotune.DecisionFor(l, t.world)
			switch {
			case derr == nil:
				slog.Info("autotune: starting with the settings decided for a world like this one", "log", at.LogFile,
					"settings", s.String(), "decided in", w.String(), "world", t.world.String())
				t.reused, t.reusedIn, t.toSend = &s, w, true
				return nil
			case errors.Is(derr, csvlog.ErrNoDecision), errors.Is(derr, autotune.ErrNoDecisionForWorld):
				// Earlier rounds' rows, and decisions for other worlds, stay; a log of another
				// job that decided nothing is replaced, as outside elastic jobs.
				appendLog = autotune.CanAppend(l) && (at.Round > 1 || errors.Is(derr, autotune.ErrNoDecisionForWorld))
			default:
				return fmt.Errorf("autotune: the decision in %s: %w", at.LogFile, derr)
			}
		}
	}
	builtin := DefaultConfig()
	tc := autotune.Config{
		Defaults:       defaults,
		Builtin:        autotune.Settings{FusionBytes: builtin.FusionBytes, CycleTime: builtin.CycleTime},
		WarmupSamples:  at.WarmupSamples,
		StepsPerSample: at.StepsPerSample,
		MaxSamples:     at.MaxSamples,
		Noise:          at.Noise,
		Seed:           1,
		World:          t.world,
		AppendLog:      appendLog,
	}
	if at.LogFile != "" {
		flags := os.O_WRONLY | os.O_CREATE | os.O_TRUNC
		if appendLog {
			// One write per row (csvlog flushes each), so a row of a rank 0 that is still
			// leaving the last round cannot split one of this round's.
			flags = os.O_WRONLY | os.O_APPEND
		}
		f, err := os.OpenFile(at.LogFile, flags, 0o644)
		if err != nil {
			return fmt.Errorf("autotune: open the log: %w", err)
		}
		t.logFile = f
		tc.Log = f
	}
	tu, err := autotune.New(tc)
	if err != nil {
		if t.logFile != nil {
			t.logFile.Close()
			t.logFile = nil
		}
		return fmt.Errorf("autotune: %w", err)
	}
	t.tuner = tu
	return nil
}

// readLog reads the autotune log at path: nil and no error when there is none yet (no file, or an
// empty one).
func readLog(path string) (*csvlog.Log, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() == 0 {
		return nil, nil
	}
	return csvlog.Read(f)
}

// countHosts is the number of distinct hosts in hosts (0 when none are known).
func countHosts(hosts []string) int {
	seen := map[string]bool{}
	for _, h := range hosts {
		seen[h] = true
	}
	return len(seen)
}

// MarkStep tells the engine that the program finished an optimizer step (the Python
// DistributedOptimizer marks each of its steps). The settings rank 0's autotuner chose for the
// next step come into force here, and on rank 0 the tuner times the step.
func (e *Engine) MarkStep() {
	e.obs.observeStep(time.Now())
	t := &e.tune
	t.mu.Lock()
	step := t.steps.Add(1)
	e.applyDueLocked(step)
	var send *negotiate.Settings
	var done *autotune.Result
	var samples []autotune.SampleEnd
	switchTo := func(s autotune.Settings, from int64) {
		ns := negotiate.Settings{From: from, FusionBytes: s.FusionBytes, CycleTime: s.CycleTime, Collectives: collectivesOf(s, e.cfg),
			SpinTime: s.SpinTime, Cache: e.cacheSwitch(s)}
		t.pending = append(t.pending, ns)
		send = &ns
	}
	if t.toSend {
		// A decision read back from the log: every rank switches to it at the same step, as to
		// a tuner's, the tuner's Lag steps on (time for the message to reach every rank).
		t.toSend = false
		switchTo(*t.reused, step+autotune.DefaultLag)
	}
	if t.tuner != nil {
		if s, from, change := t.tuner.Step(step, time.Now()); change {
			switchTo(s, from)
		}
		samples = t.tuner.TakeSamples()
		if t.tuner.Done() {
			e.finishTunerLocked()
			done = t.result
		}
	}
	var msg []byte
	if send != nil {
		t.buf = negotiate.EncodeSettings(t.buf[:0], *send)
		msg = t.buf
	}
	t.mu.Unlock()
	if tl := e.tl.Load(); tl != nil {
		for _, sm := range samples {
			tl.Mark("AUTOTUNE " + sm.String())
		}
	}
	if msg != nil {
		e.sendSettings(msg, send.From)
	}
	if done != nil {
		slog.Info("autotune decided", "rank", e.g.Rank, "result", done.String())
	}
}

// sendSettings sends a Settings message to every other rank, at once and for at most
// tellWait: a rank it does not reach applies nothing, and its ops then run under other settings,
// which costs speed, never correctness (every rank executes the responses rank 0 fused).
func (e *Engine) sendSettings(msg []byte, from int64) {
	ctx, cancel := context.WithTimeout(context.Background(), tellWait)
	defer cancel()
	var wg sync.WaitGroup
	for r := range e.g.Size {
		if r == e.g.Rank || e.g.Messenger.Lost(r) != nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := e.g.Messenger.SendMsg(ctx, r, msg); err != nil {
				slog.Warn("autotune: could not send rank its settings", "rank", e.g.Rank, "to", r, "from step", from, "err", err)
			}
		}()
	}
	wg.Wait()
}

// receiveSettings takes a Settings message from rank 0 (the driver calls it).
func (e *Engine) receiveSettings(s negotiate.Settings) {
	t := &e.tune
	t.mu.Lock()
	defer t.mu.Unlock()
	t.pending = append(t.pending, s)
	if step := t.steps.Load(); s.From <= step {
		// Late: this rank ran the step it was meant for under the old settings. It switches now,
		// and says so: with Lag >= 2 it means the ranks were out of step by more than a step.
		slog.Warn("autotune: settings arrived after the step they were meant for", "rank", e.g.Rank, "from step", s.From, "now", step)
		e.applyDueLocked(step + 1)
	}
}

// applyDueLocked brings into force the pending settings due by step (under t.mu).
func (e *Engine) applyDueLocked(step int64) {
	t := &e.tune
	kept := t.pending[:0]
	for _, s := range t.pending {
		if s.From > step {
			kept = append(kept, s)
			continue
		}
		t.cycle.Store(int64(s.CycleTime))
		if s.SpinTime > 0 {
			e.setSpin(s.SpinTime)
		}
		if e.g.Rank == 0 {
			t.fusion.Store(s.FusionBytes)
			if s.Cache != negotiate.CacheUnchanged {
				t.cache.Store(uint32(s.Cache))
			}
			if s.Collectives != t.colls {
				c := s.Collectives
				t.colls = c
				t.retune.Store(&c)
			}
			e.wakeDriver()
		}
		t.applied = append(t.applied, appliedSettings{Step: step, Wanted: s.From, FusionBytes: s.FusionBytes, CycleTime: s.CycleTime,
			SpinTime: e.spinTime(), Cache: s.Cache})
		if tl := e.tl.Load(); tl != nil {
			as := autotune.Settings{FusionBytes: s.FusionBytes, CycleTime: s.CycleTime, SpinTime: s.SpinTime}
			if s.Cache != negotiate.CacheUnchanged {
				as.ResponseCache = autotune.SwitchOf(s.Cache == negotiate.CacheOn)
			}
			tl.Mark(fmt.Sprintf("AUTOTUNE step %d: %v", step, as))
		}
	}
	t.pending = kept
}

// retune brings a Retune response's collective settings into force in the global set's executor:
// every rank does so at the same place in the response stream, so that every op runs under the
// same settings everywhere. Process sets keep theirs (Hub.Retune).
func (e *Engine) retune(r *negotiate.Response) {
	x := e.global.exec
	x.tun.SmallAllreduceBytes = int(r.Tune.SmallAllreduceBytes)
	x.tun.SharedRoundBytes = int(r.Tune.SharedRoundBytes)
	x.cfg.Hierarchical = r.Tune.Hierarchical
	t := &e.tune
	t.mu.Lock()
	t.retuned = append(t.retuned, appliedCollectives{Seq: r.Seq, Step: t.steps.Load(), Collectives: r.Tune})
	t.mu.Unlock()
	if tl := e.tl.Load(); tl != nil {
		tl.Mark(fmt.Sprintf("AUTOTUNE response %d: small allreduce %d B, shm round %d B, hierarchical %v",
			r.Seq, r.Tune.SmallAllreduceBytes, r.Tune.SharedRoundBytes, r.Tune.Hierarchical))
	}
}

// applyFusion hands the Hub a fusion threshold and collective settings that came into force (the
// driver calls it).
func (e *Engine) applyFusion() {
	if e.hub == nil {
		return
	}
	if c := e.tune.retune.Swap(nil); c != nil {
		e.hub.Retune(*c)
	}
	if c := negotiate.CacheSwitch(e.tune.cache.Swap(uint32(negotiate.CacheUnchanged))); c != negotiate.CacheUnchanged {
		e.hub.SetCacheOff(c == negotiate.CacheOff)
	}
	if n := e.tune.fusion.Swap(-1); n >= 0 {
		if n == 0 {
			n = -1 // the tuner's "no fusion" is the Hub's "never fuse"
		}
		e.hub.SetFusionBytes(n)
	}
}

// finishTunerLocked closes the tuner and its log once it decided, and keeps the decision.
func (e *Engine) finishTunerLocked() {
	t := &e.tune
	if t.tuner == nil {
		return
	}
	r := t.tuner.Result()
	t.result = &r
	if err := t.tuner.Close(); err != nil {
		slog.Warn("autotune: write the log's decision", "err", err)
	}
	if t.logFile != nil {
		if err := t.logFile.Close(); err != nil {
			slog.Warn("autotune: close the log", "err", err)
		}
		t.logFile = nil
	}
	t.tuner = nil
}

// AutotuneReport is the line that says what the autotuner did, for rank 0 to print when the job
// ends ("" elsewhere, or with autotuning off). A job that ends before the tuner decided says so,
// and how far it got; its log has no decision, so the next run tunes again. In an elastic job each
// round's engine says it for its round ("autotune, round 2, 2 ranks on 1 host: ..."), when the
// round ends: the last such line is the job's.
func (e *Engine) AutotuneReport() string {
	t := &e.tune
	t.mu.Lock()
	defer t.mu.Unlock()
	var line string
	switch {
	case t.result != nil:
		line = t.result.String()
	case t.reused != nil:
		line = "autotune: used the settings decided by an earlier run (" + e.cfg.Autotune.LogFile + "): " + t.reused.String()
		if e.cfg.Autotune.Round > 0 {
			line = "autotune: used the settings decided for " + t.reusedIn.String() + " (" + e.cfg.Autotune.LogFile + "): " + t.reused.String()
		}
	case t.tuner != nil:
		r := t.tuner.Result()
		e.finishTunerLocked()
		what := "the job"
		if e.cfg.Autotune.Round > 0 {
			what = "the round"
		}
		line = fmt.Sprintf("autotune: %s ended before a decision (%d samples, %d steps): it ran with the defaults (%v) but for its samples",
			what, r.Samples, t.steps.Load(), autotune.Settings{FusionBytes: max(e.cfg.FusionBytes, 0), CycleTime: e.cfg.CycleTime})
	default:
		return ""
	}
	if e.cfg.Autotune.Round > 0 {
		line = "autotune, " + t.world.String() + ":" + strings.TrimPrefix(line, "autotune:")
	}
	return line
}
