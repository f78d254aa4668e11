package engine

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/kolo-dl/kolo/internal/engine/negotiate"
	"github.com/kolo-dl/kolo/internal/timeline"
)

// The engine records into a timeline.Timeline when one runs (see package timeline for the phases):
// submissions as the coordinator learns of them (rank 0: every rank's, through the Batches it
// receives), decisions and execution as this rank runs them, and a cycle marker for each loop step
// that did something (kolo has no fixed cycle: negotiation happens when messages arrive). Rank 0
// records, as Horovod's does; a path containing {rank} makes every rank record its own file, which
// shows execution on ranks that are not in a process set with rank 0.

// Activity names, as Horovod's timeline calls them.
const (
	memcpyIn  = "MEMCPY_IN_FUSION_BUFFER"
	memcpyOut = "MEMCPY_OUT_FUSION_BUFFER"
)

var opLabels, collectiveLabels [negotiate.Join + 1]string

func init() {
	for k := range opLabels {
		name := strings.ToUpper(negotiate.OpKind(k).String())
		opLabels[k], collectiveLabels[k] = name, "KOLO_"+name
	}
}

// opLabel names an op kind in the timeline: ALLREDUCE, ...
func opLabel(k negotiate.OpKind) string {
	if int(k) < len(opLabels) {
		return opLabels[k]
	}
	return k.String()
}

// collectiveLabel names the collective itself, inside the op's span: KOLO_ALLREDUCE, ...
func collectiveLabel(k negotiate.OpKind) string {
	if int(k) < len(collectiveLabels) {
		return collectiveLabels[k]
	}
	return k.String()
}

// StartTimeline starts writing a Chrome trace of this rank's engine to path, replacing a running
// one. Only rank 0 records, unless path contains "{rank}", which every rank replaces with its rank
// to record its own file; on other ranks this is a no-op. Safe to call from any goroutine, also
// with StopTimeline.
func (e *Engine) StartTimeline(path string, markCycles bool) error {
	if !strings.Contains(path, "{rank}") && e.g.Rank != 0 {
		return nil
	}
	path = strings.ReplaceAll(path, "{rank}", strconv.Itoa(e.g.Rank))
	e.tlMu.Lock()
	defer e.tlMu.Unlock()
	var stopErr error
	if old := e.tl.Load(); old != nil && old.Path() == path {
		// The same file: the old recording must finish before the new one truncates it, or its
		// last write lands in the middle of the new trace.
		stopErr = e.stopTimeline()
	}
	tl, err := timeline.Start(path, markCycles)
	if err != nil {
		return errors.Join(stopErr, fmt.Errorf("rank %d: %w", e.g.Rank, err))
	}
	if old := e.tl.Swap(tl); old != nil {
		if err := old.Stop(); err != nil {
			return fmt.Errorf("rank %d: %w", e.g.Rank, err)
		}
	}
	return stopErr
}

// StopTimeline finishes the running timeline's file, if any. Safe to call from any goroutine;
// it returns once the file is complete.
func (e *Engine) StopTimeline() error {
	e.tlMu.Lock()
	defer e.tlMu.Unlock()
	return e.stopTimeline()
}

// stopTimeline is StopTimeline under tlMu.
func (e *Engine) stopTimeline() error {
	if old := e.tl.Swap(nil); old != nil {
		if err := old.Stop(); err != nil {
			return fmt.Errorf("rank %d: %w", e.g.Rank, err)
		}
	}
	return nil
}

// timelineBatch records the submissions in a Batch that rank from sent the coordinator. Ops sent
// as cache ids are named through the Hub.
func (e *Engine) timelineBatch(tl *timeline.Timeline, from int, b *negotiate.Batch) {
	for i := range b.Requests {
		tl.Submitted(b.Set, b.Requests[i].Name, opLabel(b.Requests[i].Kind), from)
	}
	for _, id := range b.Cached {
		if name, kind, ok := e.hub.CachedName(b.Set, b.Seen, id); ok {
			tl.Submitted(b.Set, name, opLabel(kind), from)
		}
	}
}
