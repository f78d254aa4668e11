package negotiate

import (
	"fmt"
	"slices"
	"time"
)

// Hub is rank 0's negotiation state for a job with process sets: the global set (id 0, every rank)
// and each registered subset of ranks has its own Coordinator, working in the set's own ranks
// 0..n-1, and Batches name their set. Sets negotiate independently: an op of set {0,1} is ready
// once ranks 0 and 1 have submitted it, whatever rank 2 does, and the same name may be in flight in
// two sets.
//
// Rank 0 coordinates every set, including those it is not a member of, so that all responses come
// out of one place in one order (Ready's), and every rank executes the responses of its sets in
// that order. That single order is what keeps overlapping sets from deadlocking: with sets {0,1},
// {1,2} and {0,2} coordinated separately, rank 0 could be running {0,2}'s op while waiting to start
// {0,1}'s, rank 1 running {0,1}'s while 2 waits in {1,2}'s, and so on round the cycle. With one
// order, the earliest op not yet done has all its members free to run it.
//
// Like the Coordinator it is pure and not safe for concurrent use.
type Hub struct {
	cfg   Config
	sets  map[int]*hubSet
	ids   []int // ascending
	serve []int // ids in Ready's order: ascending, 0 last
	out   []SetResponses
}

type hubSet struct {
	id    int
	ranks []int // job ranks, ascending
	co    *Coordinator
}

// SetResponses is what one set's Coordinator emitted: responses for Members (job ranks, ascending)
// to execute in order.
type SetResponses struct {
	Set       int
	Members   []int
	Responses []Response
}

// NewHub makes the Hub of a job of cfg.Size ranks, with the global set only. cfg configures every
// set's Coordinator (Size and Ranks are set per set).
func NewHub(cfg Config) (*Hub, error) {
	if cfg.Ranks != nil {
		return nil, fmt.Errorf("negotiate: hub: Config.Ranks is per process set, leave it nil")
	}
	all := make([]int, cfg.Size)
	for i := range all {
		all[i] = i
	}
	h := &Hub{cfg: cfg, sets: map[int]*hubSet{}}
	co, err := NewCoordinator(cfg)
	if err != nil {
		return nil, err
	}
	h.sets[0] = &hubSet{id: 0, ranks: all, co: co}
	h.ids, h.serve = []int{0}, []int{0}
	return h, nil
}

// AddSet starts coordinating process set id over ranks (job ranks, ascending, no duplicates).
func (h *Hub) AddSet(id int, ranks []int) error {
	if _, ok := h.sets[id]; ok || id <= 0 {
		return fmt.Errorf("negotiate: hub: process set id %d is taken", id)
	}
	if err := checkSetRanks(ranks, h.cfg.Size); err != "" {
		return fmt.Errorf("negotiate: hub: process set %d: %s", id, err)
	}
	cfg := h.cfg
	cfg.Size, cfg.Ranks = len(ranks), ranks
	co, err := NewCoordinator(cfg)
	if err != nil {
		return err
	}
	h.sets[id] = &hubSet{id: id, ranks: slices.Clone(ranks), co: co}
	i, _ := slices.BinarySearch(h.ids, id)
	h.ids = slices.Insert(h.ids, i, id)
	h.serve = append(slices.Clone(h.ids[1:]), 0)
	return nil
}

// RemoveSet stops coordinating process set id. Ops some members had submitted are forgotten: the
// members fail them themselves when they apply the removal.
func (h *Hub) RemoveSet(id int) error {
	if id == 0 {
		return fmt.Errorf("negotiate: hub: the global process set cannot be removed")
	}
	if _, ok := h.sets[id]; !ok {
		return fmt.Errorf("negotiate: hub: no process set %d", id)
	}
	delete(h.sets, id)
	i, _ := slices.BinarySearch(h.ids, id)
	h.ids = slices.Delete(h.ids, i, i+1)
	h.serve = append(slices.Clone(h.ids[1:]), 0)
	return nil
}

// Coordinator returns the Coordinator of process set id, or nil.
func (h *Hub) Coordinator(id int) *Coordinator {
	if s := h.sets[id]; s != nil {
		return s.co
	}
	return nil
}

// Pending is the number of ops, over every set, that some but not all members have submitted.
func (h *Hub) Pending() int {
	n := 0
	for _, s := range h.sets {
		n += s.co.Pending()
	}
	return n
}

// SubmitBatch takes one message that job rank from sent. b.Set picks the set, and b.Rank must be
// from's rank in it. An error is a broken protocol (unknown set, a non-member, a wrong rank), not a
// problem with the ops: the engine treats it as a malformed message.
func (h *Hub) SubmitBatch(now time.Time, from int, b *Batch) error {
	s := h.sets[b.Set]
	if s == nil {
		return fmt.Errorf("negotiate: batch from rank %d for process set %d, which does not exist", from, b.Set)
	}
	r, ok := slices.BinarySearch(s.ranks, from)
	if !ok {
		return fmt.Errorf("negotiate: batch from rank %d for process set %d (ranks %s), which it is not in", from, b.Set, formatRanks(s.ranks))
	}
	if b.Rank != r {
		return fmt.Errorf("negotiate: batch from rank %d for process set %d claims set rank %d, want %d", from, b.Set, b.Rank, r)
	}
	return s.co.SubmitBatch(now, b)
}

// CachedName tells what cache id meant, in process set `set`, to a rank that had learned seen of
// its responses: for the engine's timeline, which wants names for ops sent as ids.
func (h *Hub) CachedName(set int, seen uint64, id uint32) (string, OpKind, bool) {
	s := h.sets[set]
	if s == nil {
		return "", InvalidOp, false
	}
	e := s.co.cache.resolve(id, seen)
	if e == nil {
		return "", InvalidOp, false
	}
	return e.sig.name, e.sig.kind, true
}

// Ready returns what every set resolved since the last call: the order in which the engine sends
// and executes them. Sets come in ascending id, the global set last: process sets are added and
// removed by ops of the global set, and a removal must follow the responses its set emitted in the
// same call, which its members submitted before they asked for the removal. The slice is valid
// until the next call of Ready or Tick.
func (h *Hub) Ready() []SetResponses {
	clear(h.out)
	out := h.out[:0]
	defer func() { h.out = out }()
	for _, id := range h.serve {
		s := h.sets[id]
		if rs := s.co.Ready(); len(rs) > 0 {
			out = append(out, SetResponses{Set: id, Members: s.ranks, Responses: rs})
		}
	}
	return out
}

// Tick runs every set's stall inspector and returns, in Ready's order, what became ready (valid
// until the next call of Ready or Tick). Stalls of a set other than the global one carry its id.
func (h *Hub) Tick(now time.Time) ([]SetResponses, []Stall) {
	var stalls []Stall
	clear(h.out)
	out := h.out[:0]
	defer func() { h.out = out }()
	for _, id := range h.serve {
		s := h.sets[id]
		rs, st := s.co.Tick(now)
		for i := range st {
			st[i].Set = id
		}
		stalls = append(stalls, st...)
		if len(rs) > 0 {
			out = append(out, SetResponses{Set: id, Members: s.ranks, Responses: rs})
		}
	}
	return out, stalls
}

// checkSetRanks says what is wrong with ranks as a process set of a job of size ranks, or "".
func checkSetRanks(ranks []int, size int) string {
	if len(ranks) == 0 {
		return "no ranks"
	}
	for i, r := range ranks {
		switch {
		case r < 0 || r >= size:
			return fmt.Sprintf("rank %d is outside the job's ranks [0,%d)", r, size)
		case i > 0 && r == ranks[i-1]:
			return fmt.Sprintf("rank %d is listed twice", r)
		case i > 0 && r < ranks[i-1]:
			return fmt.Sprintf("ranks %v are not in ascending order", ranks)
		}
	}
	return ""
}
