package negotiate

import (
	"fmt"
	"slices"
	"time"
)

// ShutdownName is the global set's barrier every rank passes on its way out (the engine's
// Shutdown). A rank that submitted it has ended: see Coordinator.End.
const ShutdownName = "kolo.shutdown"

// SetChangePrefix names the global set's allgathers that carry process set changes (the engine's
// own ops). They run with joined ranks too, which propose nothing but apply the verdict.
const SetChangePrefix = "kolo.process_set#"

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
	// cacheOff: the response cache is off for now (SetCacheOff).
	cacheOff bool
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
	co.SetCacheOff(h.cacheOff)
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

// SetFusionBytes is Coordinator.SetFusionBytes for every set, and for sets added later.
func (h *Hub) SetFusionBytes(n int64) {
	h.cfg.FusionBytes = n
	for _, hs := range h.sets {
		hs.co.SetFusionBytes(n)
	}
}

// SetCacheOff turns every set's response cache off or back on (Coordinator.SetCacheOff), and
// that of sets added later.
func (h *Hub) SetCacheOff(off bool) {
	h.cacheOff = off
	for _, hs := range h.sets {
		hs.co.SetCacheOff(off)
	}
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

// Waiting sets waiting[r] for every job rank r that has submitted, in some set, something not yet
// answered (Coordinator.Waiting). waiting has one entry per job rank; it is not cleared first.
func (h *Hub) Waiting(waiting []bool) {
	for _, s := range h.sets {
		s.co.Waiting(waiting)
	}
}

// Missing sets missing[r] for every job rank r that, in some set, another rank waits on
// (Coordinator.Missing). missing has one entry per job rank; it is not cleared first.
func (h *Hub) Missing(missing []bool) {
	for _, s := range h.sets {
		s.co.Missing(missing)
	}
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
	if err := s.co.SubmitBatch(now, b); err != nil {
		return err
	}
	if b.Set == 0 && s.co.Ended(from) {
		// A rank that reached shutdown submits nothing more in any set.
		for _, id := range h.ids {
			if o := h.sets[id]; id != 0 {
				if i, ok := slices.BinarySearch(o.ranks, from); ok {
					o.co.End(now, i)
				}
			}
		}
	}
	return nil
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

// Retune has the global set's next responses start with a Retune to s (Coordinator.Retune). Process
// sets keep the collective settings they were created under: their members meet the global
// stream's Retune at different points of their own sets' streams.
func (h *Hub) Retune(s Collectives) {
	if g := h.sets[0]; g != nil {
		g.co.Retune(s)
	}
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
	stalls := h.failSetMismatches(now, nil)
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

// SetMismatchGrace is how long an op must have waited before Tick takes it for one that ranks
// submitted in different process sets: long enough for a rank that submits the same name in two
// sets it belongs to, in another order than its peers, to catch up.
const SetMismatchGrace = 250 * time.Millisecond

// failSetMismatches fails, in both sets, each op that ranks submitted in different process sets:
// an op of one name pending in sets A and B for SetMismatchGrace, where a rank missing from A's op
// submitted B's and a rank missing from B's submitted A's. Neither can complete (their missing
// ranks wait in the other set), as in Horovod, where that hangs; every rank gets an error naming
// the sets and who used which. Legitimate ops of one name in two sets never cross that way for
// long: a rank in both sets submits the name in each.
func (h *Hub) failSetMismatches(now time.Time, stalls []Stall) []Stall {
	if len(h.sets) < 2 {
		return stalls
	}
	type setOp struct {
		s *hubSet
		o *op
	}
	var byName map[string][]setOp
	for _, id := range h.ids {
		s := h.sets[id]
		for o := s.co.head; o != nil; o = o.next {
			if now.Sub(o.since) < SetMismatchGrace || o.err != "" {
				continue
			}
			if byName == nil {
				byName = map[string][]setOp{}
			}
			byName[o.name] = append(byName[o.name], setOp{s, o})
		}
	}
	// submitted and missing list an op's job ranks that did, and did not (and did not join),
	// submit it.
	submitted := func(x setOp) []int {
		var out []int
		for r, how := range x.o.sent {
			if how != subAbsent {
				out = append(out, x.s.co.ids.of(r))
			}
		}
		return out
	}
	missing := func(x setOp) []int {
		var out []int
		for r, how := range x.o.sent {
			if how == subAbsent && !x.s.co.joined[r] {
				out = append(out, x.s.co.ids.of(r))
			}
		}
		return out
	}
	crosses := func(a, b setOp) bool {
		sb := submitted(b)
		for _, r := range missing(a) {
			if slices.Contains(sb, r) {
				return true
			}
		}
		return false
	}
	setName := func(s *hubSet) string {
		if s.id == 0 {
			return "the global process set"
		}
		return fmt.Sprintf("process set %d (ranks %s)", s.id, formatRanks(s.ranks))
	}
	var fail []setOp
	var msgs []string
	names := make([]string, 0, len(byName))
	for name := range byName {
		names = append(names, name)
	}
	slices.Sort(names) // a deterministic order of errors in each set's stream
	for _, name := range names {
		xs := byName[name]
		for i := 0; i < len(xs); i++ {
			for j := i + 1; j < len(xs); j++ {
				a, b := xs[i], xs[j]
				if !crosses(a, b) || !crosses(b, a) {
					continue
				}
				msg := fmt.Sprintf("%s %q: ranks disagree on its process set: %s submitted it in %s, %s in %s",
					a.o.kind, name, rankWord(submitted(a)), setName(a.s), rankWord(submitted(b)), setName(b.s))
				for _, x := range []setOp{a, b} {
					if !slices.ContainsFunc(fail, func(y setOp) bool { return y.o == x.o }) {
						fail = append(fail, x)
						msgs = append(msgs, msg)
					}
				}
			}
		}
	}
	for i, x := range fail {
		stalls = append(stalls, Stall{Name: x.o.name, Kind: x.o.kind, Since: now.Sub(x.o.since), Fatal: true,
			Ready: submitted(x), Missing: missing(x), Reason: msgs[i], Set: x.s.id})
		x.o.err = msgs[i]
		x.s.co.resolve(now, x.o)
	}
	return stalls
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
