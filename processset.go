package kolo

import (
	"context"
	"fmt"
	"slices"

	"github.com/kolo-dl/kolo/internal/engine/negotiate"
)

// ProcessSet is a registered subset of the job's ranks that runs collectives among themselves
// (Horovod's process sets). Pass InProcessSet(ps) to a collective to run it in the set: only members
// may submit it, names are matched within the set, and ops of different sets proceed independently
// (an op of set {0,1} never waits for rank 2). Within a set, a broadcast root is still a job rank;
// alltoall splits and reducescatter shares are per member, in rank order; average divides by the
// set's size. Join works on the global set only.
//
// Sets are added and removed collectively (every rank calls AddProcessSet with the same ranks, in
// the same order as its other AddProcessSet and RemoveProcessSet calls). Within a non-global set,
// collectives use the message-passing algorithms: the shared-memory and hierarchical fast paths
// serve the global set only.
type ProcessSet struct {
	id    int
	ranks []int // nil for the global set: every rank
}

// GlobalProcessSet is every rank of the job (id 0): what collectives run in without InProcessSet.
var GlobalProcessSet = ProcessSet{}

// ID is the set's id, the same on every rank (0: the global set).
func (ps ProcessSet) ID() int { return ps.id }

// Ranks returns the set's job ranks, ascending (every rank for the global set; nil before Init).
func (ps ProcessSet) Ranks() []int {
	if ps.id != 0 {
		return slices.Clone(ps.ranks)
	}
	n := Size()
	if n < 0 {
		return nil
	}
	all := make([]int, n)
	for i := range all {
		all[i] = i
	}
	return all
}

// Size is the number of ranks in the set (-1 for the global set before Init).
func (ps ProcessSet) Size() int {
	if ps.id == 0 {
		return Size()
	}
	return len(ps.ranks)
}

// Rank is this process's rank within the set: its index among the set's ranks, or -1 when it is
// not a member.
func (ps ProcessSet) Rank() int {
	if ps.id == 0 {
		return Rank()
	}
	if i, ok := slices.BinarySearch(ps.ranks, Rank()); ok {
		return i
	}
	return -1
}

// Included reports whether this process is a member of the set.
func (ps ProcessSet) Included() bool { return ps.Rank() >= 0 }

func (ps ProcessSet) String() string {
	if ps.id == 0 {
		return "ProcessSet(global)"
	}
	return fmt.Sprintf("ProcessSet(id=%d, ranks=%v)", ps.id, ps.ranks)
}

// InProcessSet runs a collective in ps instead of the global set.
func InProcessSet(ps ProcessSet) OpOption { return inSet(ps.id) }

// InProcessSetID is InProcessSet for a set known by its id (the C ABI passes ids).
func InProcessSetID(id int) OpOption { return inSet(id) }

func inSet(id int) OpOption { return func(s *opSettings) { s.req.Set = id } }

// AddProcessSet registers ranks (job ranks, any order) as a process set. It is collective: every
// rank must call it with the same ranks, also the ranks outside the set; if they differ, every rank
// gets the same error saying what each rank sent. Registering ranks that already form a set (or all
// ranks: the global set) is an error.
func AddProcessSet(ctx context.Context, ranks []int) (ProcessSet, error) {
	h := AddProcessSetAsync(ranks)
	if err := h.Wait(ctx); err != nil {
		return ProcessSet{}, fmt.Errorf("kolo.AddProcessSet(%v): %w", ranks, err)
	}
	return ProcessSetByID(h.ProcessSetID())
}

// AddProcessSetAsync is AddProcessSet as a Handle; ProcessSetID gives the new set's id once it
// completed successfully.
func AddProcessSetAsync(ranks []int) *Handle {
	s, err := get()
	if err != nil {
		return failed(err)
	}
	return &Handle{h: s.engine.AddProcessSetAsync(ranks), kind: negotiate.Allgather}
}

// ProcessSetID is, for AddProcessSetAsync, the new process set's id (valid after a successful Wait).
func (h *Handle) ProcessSetID() int {
	if h.early != nil {
		return 0
	}
	return h.h.ProcessSetID()
}

// RemoveProcessSet removes ps, collectively as AddProcessSet. Ops of the set still pending on a
// member fail; ids are not reused.
func RemoveProcessSet(ctx context.Context, ps ProcessSet) error {
	if err := RemoveProcessSetAsync(ps.id).Wait(ctx); err != nil {
		return fmt.Errorf("kolo.RemoveProcessSet(%d): %w", ps.id, err)
	}
	return nil
}

// RemoveProcessSetAsync is RemoveProcessSet, by id, as a Handle.
func RemoveProcessSetAsync(id int) *Handle {
	s, err := get()
	if err != nil {
		return failed(err)
	}
	return &Handle{h: s.engine.RemoveProcessSetAsync(id), kind: negotiate.Allgather}
}

// ProcessSetByID returns the registered set with id.
func ProcessSetByID(id int) (ProcessSet, error) {
	s, err := get()
	if err != nil {
		return ProcessSet{}, err
	}
	if id == 0 {
		return GlobalProcessSet, nil
	}
	r, ok := s.engine.ProcessSetRanks(id)
	if !ok {
		return ProcessSet{}, fmt.Errorf("kolo: no process set %d (never added, or removed)", id)
	}
	return ProcessSet{id: id, ranks: r}, nil
}
