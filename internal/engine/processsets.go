package engine

// Process sets: subsets of the job's ranks that run ops among themselves (Horovod's process sets).
//
// Every set has its own negotiation: its own Coordinator in rank 0's Hub (rank 0 coordinates every
// set, member or not), its own response stream and cache on each member, its own names (the same
// name may be in flight in two sets). An op of set {0,1} therefore completes without rank 2 doing
// anything. Execution runs on each member over a transport.Sub of the job's Comm, in set ranks, with
// the message-passing algorithms: the shared-memory and hierarchical fast paths need every rank of a
// host or of the job, so they serve the global set only.
//
// Rank 0 emits every set's responses in one order (see negotiate.Hub), and each rank executes its
// sets' responses in that order: that is what keeps overlapping sets from deadlocking. It costs rank
// 0 a driver that keeps reading control messages while a set it is not in exists (foreign), since
// nobody waits on rank 0 for those ops.
//
// Adding and removing a set is collective over every rank: each rank proposes the change (an
// allgather of the global set, named kolo.process_set#k after this rank's k-th change call, so ranks
// must make their calls in the same order), and each applies the gathered proposals to its
// negotiate.SetTable when the allgather runs, all reaching the same verdict at the same place of
// the stream. Rank 0 installs or drops the set's Coordinator at that same place, so a member's first
// op of a new set never reaches it before the set exists.

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/kolo-dl/kolo/internal/dtype"
	"github.com/kolo-dl/kolo/internal/engine/negotiate"
	"github.com/kolo-dl/kolo/internal/gpu"
	"github.com/kolo-dl/kolo/internal/transport"
)

// setChangePrefix names the allgathers that carry process set changes; users cannot submit such
// names.
const setChangePrefix = negotiate.SetChangePrefix

// procSet is a process set as this rank's engine sees it. id, ranks and rank never change; removed
// is set under Engine.mu; the rest is driver-owned.
type procSet struct {
	id      int
	ranks   []int // job ranks, ascending
	rank    int   // this rank's index in ranks; -1 if not a member
	removed bool

	// Members only.
	dcomm    gpu.Comm // the device path's communicator of the set (device.go); nil without one
	dcommErr error    // why it has none
	cache    *negotiate.Cache
	exec     *executor
	pending  map[string]*entry // submitted on this rank, not yet executed
	// behind holds, by name, ops submitted on this rank while a refusal of their name was
	// pending, in the order they came (see Engine.reserve).
	behind map[string][]*entry
}

// admit checks that this rank may submit req to ps and rewrites a broadcast root from a job rank to
// a set rank.
func (e *Engine) admit(req *negotiate.Request, ps *procSet) error {
	switch {
	case ps == nil:
		return fmt.Errorf("rank %d: %s %q: no process set %d (never added, or removed)", e.g.Rank, req.Kind, req.Name, req.Set)
	case ps.rank < 0:
		return fmt.Errorf("rank %d: %s %q: this rank is not in process set %d (ranks %v)", e.g.Rank, req.Kind, req.Name, ps.id, ps.ranks)
	case ps.id == 0:
		return nil
	case req.Kind == negotiate.Join:
		return fmt.Errorf("rank %d: join works on the global process set only, not process set %d", e.g.Rank, ps.id)
	case req.Kind == negotiate.Broadcast:
		root, ok := slices.BinarySearch(ps.ranks, req.Root)
		if !ok && req.Error == "" {
			// Refused, not rejected: the set's other members hear of it (see enqueue).
			req.Error = fmt.Sprintf("root rank %d is not in process set %d (ranks %v)", req.Root, ps.id, ps.ranks)
		}
		req.Root = root
	}
	return nil
}

// AddProcessSet registers ranks (job ranks, in any order) as a process set and returns its id.
// Every rank must call it, with the same ranks, in the same order relative to its other
// AddProcessSet and RemoveProcessSet calls; if the ranks differ, every rank gets the same error
// saying what each sent.
func (e *Engine) AddProcessSet(ctx context.Context, ranks []int) (int, error) {
	h := e.AddProcessSetAsync(ranks)
	if err := h.Wait(ctx); err != nil {
		return 0, fmt.Errorf("add process set %v: %w", ranks, err)
	}
	return h.ProcessSetID(), nil
}

// AddProcessSetAsync is AddProcessSet as a Handle: ProcessSetID gives the id once it succeeded.
func (e *Engine) AddProcessSetAsync(ranks []int) *Handle {
	sorted := slices.Clone(ranks)
	slices.Sort(sorted)
	return e.changeSets(negotiate.SetChange{Ranks: sorted})
}

// RemoveProcessSet removes process set id, collectively as AddProcessSet. Ops of the set still
// pending on a member fail.
func (e *Engine) RemoveProcessSet(ctx context.Context, id int) error {
	if err := e.RemoveProcessSetAsync(id).Wait(ctx); err != nil {
		return fmt.Errorf("remove process set %d: %w", id, err)
	}
	return nil
}

// RemoveProcessSetAsync is RemoveProcessSet as a Handle.
func (e *Engine) RemoveProcessSetAsync(id int) *Handle {
	return e.changeSets(negotiate.SetChange{Remove: true, ID: id})
}

// ProcessSetRanks returns the job ranks of process set id, if it exists.
func (e *Engine) ProcessSetRanks(id int) ([]int, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	ps := e.sets[id]
	if ps == nil {
		return nil, false
	}
	return slices.Clone(ps.ranks), true
}

// changeSets submits this rank's proposal: an allgather of the global set, named by how many
// changes this rank asked for before.
func (e *Engine) changeSets(c negotiate.SetChange) *Handle {
	payload := negotiate.EncodeSetChange(nil, c)
	e.mu.Lock()
	k := e.setCalls
	e.setCalls++
	e.mu.Unlock()
	req := negotiate.Request{Name: fmt.Sprintf("%s%d", setChangePrefix, k), Kind: negotiate.Allgather,
		DType: dtype.Uint8, Shape: []int64{int64(len(payload))}}
	return e.enqueue(req, payload, nil, true, nil)
}

// applySetChanges applies the set changes among r's tensors, which every rank has just gathered,
// and finishes their handles with the verdict. It returns false when the loop must end.
func (e *Engine) applySetChanges(r *negotiate.Response, entries []*entry) bool {
	for i, name := range r.Names {
		if name == deviceSetupName {
			if err := e.applyDeviceSetup(entries[i].h.output, r.Dim0[i]); err != nil {
				e.fail(err)
				return false
			}
			continue
		}
		if !strings.HasPrefix(name, setChangePrefix) {
			continue
		}
		en := entries[i]
		c, err := e.decideSetChange(en.h.output, r.Dim0[i])
		if err != nil {
			en.h.finish(&OpError{Msg: fmt.Sprintf("rank %d: %v", e.g.Rank, err)})
			continue
		}
		if c.Remove {
			e.removeSet(c.ID)
		} else if err := e.addSet(c.ID, c.Ranks); err != nil {
			e.fail(err)
			return false
		}
		en.h.setID = c.ID
	}
	return true
}

// decideSetChange splits the gathered proposals (rows[r] bytes from rank r) and applies them to
// this rank's table.
func (e *Engine) decideSetChange(gathered []byte, rows []int64) (negotiate.SetChange, error) {
	props := make([]negotiate.SetChange, len(rows))
	off := int64(0)
	for r, n := range rows {
		if n == 0 {
			return negotiate.SetChange{}, fmt.Errorf("process set change: rank %d proposed none (it had joined)", r)
		}
		c, err := negotiate.DecodeSetChange(gathered[off : off+n])
		if err != nil {
			return negotiate.SetChange{}, fmt.Errorf("process set change from rank %d: %w", r, err)
		}
		props[r] = c
		off += n
	}
	return e.table.Apply(props)
}

// addSet installs a set the table has just registered.
func (e *Engine) addSet(id int, ranks []int) error {
	ps := &procSet{id: id, ranks: ranks, rank: -1}
	if i, ok := slices.BinarySearch(ranks, e.g.Rank); ok {
		ps.rank = i
		capacity := e.cfg.CacheCapacity
		if capacity <= 0 {
			capacity = -1
		}
		cache, err := negotiate.NewCache(i, len(ranks), capacity)
		if err != nil {
			return fmt.Errorf("rank %d: process set %d: %w", e.g.Rank, id, err)
		}
		comm, err := transport.Sub(e.g.Comm, ranks)
		if err != nil {
			return fmt.Errorf("rank %d: process set %d: %w", e.g.Rank, id, err)
		}
		hosts := make([]string, len(ranks))
		for j, r := range ranks {
			hosts[j] = e.host(r)
		}
		ps.cache, ps.pending, ps.behind = cache, map[string]*entry{}, map[string][]*entry{}
		ps.exec = e.global.exec.sub(Group{Rank: i, Size: len(ranks), Hosts: hosts, Comm: comm})
	}
	if e.dev.use.Load() {
		e.splitSet(ps) // every rank adds the set here: the split's collective order
	}
	if e.hub != nil {
		if err := e.hub.AddSet(id, ranks); err != nil {
			return fmt.Errorf("rank 0: %w", err)
		}
		if ps.rank < 0 {
			e.foreign++
		}
	}
	e.mu.Lock()
	e.sets[id] = ps
	e.mu.Unlock()
	return nil
}

// removeSet drops a set the table has just removed; this rank's ops still pending in it fail.
func (e *Engine) removeSet(id int) {
	ps := e.sets[id]
	e.mu.Lock()
	delete(e.sets, id)
	ps.removed = true
	e.mu.Unlock()
	for name, en := range ps.pending {
		en.h.finish(fmt.Errorf("rank %d: %s %q: process set %d was removed while the op was pending", e.g.Rank, en.req.Kind, name, id))
		e.inflight--
	}
	ps.pending = nil
	for name, ens := range ps.behind {
		for _, en := range ens {
			en.h.finish(fmt.Errorf("rank %d: %s %q: process set %d was removed while the op was pending", e.g.Rank, en.req.Kind, name, id))
			e.inflight--
		}
	}
	ps.behind = nil
	if ps.exec != nil {
		ps.exec.g.Comm.Close() // the view only
	}
	if e.hub != nil {
		_ = e.hub.RemoveSet(id) // the table has just removed it: it exists
		if ps.rank < 0 {
			e.foreign--
		}
	}
}
