package negotiate

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Batch is what one rank sends the Coordinator in one message: the ops it submitted since its last
// Batch, in full or as cache ids, and whether it then joined.
type Batch struct {
	// Rank is the sender.
	Rank int
	// Seen is the Seq of the last Response the sender had learned (its Cache.Seen) when it looked
	// up Cached: it tells the Coordinator what each id meant to the sender.
	Seen uint64
	// Requests are ops sent in full.
	Requests []Request
	// Cached are ops sent as cache ids. The wire keeps them as a set (ascending), not in order.
	Cached []uint32
	// Join: the sender called Join after submitting the above.
	Join bool
	// Set is the process set every op of the Batch belongs to (0: the global set); Rank and Seen
	// are the sender's in that set's numbering and response stream (see Hub).
	Set int
}

// Coordinator is the negotiation state machine rank 0 runs. It is not safe for concurrent use: the
// engine calls it from one goroutine. Errors in what ranks submit become error Responses; methods
// return an error only when the caller broke the contract (a rank out of range).
//
// An op is checked when it is complete (every rank submitted it or joined), not as soon as two
// ranks disagree: reporting early would fail the op on the ranks that had submitted and leave the
// latecomers waiting on a name nobody else will submit again. A rank submitting a name it already
// has pending, or submitting after joining, is likewise reported when the op completes. Once a
// Response (result or error) for a name is out, the name is free: a later submission starts anew.
//
// The engine's contract: every rank's engine (rank 0's too) keeps a Cache, sends Batches stamped
// by Cache.Compact, and passes every Response, in Seq order, to Cache.Learn before executing it.
// Rank 0 calls SubmitBatch for each Batch it receives and Tick (or Ready) after each, or at least
// every cycle, and sends what they return to every rank.
type Coordinator struct {
	cfg  Config
	size int
	ids  jobRanks // what messages call each rank (Config.Ranks)

	// pending ops, in creation order (head first) for deterministic scans. Each is found by name
	// either in byName or, cheaper, through the live cache entry for its name (entry.pending).
	head, tail *op
	byName     map[string]*op
	count      int
	pool       []*op

	ready      []*item // resolved, in readiness order, waiting for Ready
	itemPool   []*item
	groups     map[int64]*groupState
	groupOrder []*groupState

	joined      []bool
	joinedCount int

	// ended are the ranks that reached shutdown (submitted ShutdownName's barrier): they submit
	// nothing more, so every other op that misses one of them fails at once, naming it.
	ended      []bool
	endedCount int

	seq   uint64   // Seq of the last Response emitted
	seen  []uint64 // per rank: the largest Seen reported
	cache coordCache
	// conflicts are the groups that ranks declared differently, found while a Batch was taken:
	// SubmitBatch fails their members that miss such a rank once the whole Batch is in (a grouped
	// call's members travel in one Batch). Per group: the ranks that declared another one.
	conflicts map[int64][]bool
	// last is, per rank, when it last submitted an op (for StallCrossed: a rank that waits on an
	// op submits nothing new).
	last []time.Time

	used []bool // scratch for Ready

	// retune, when retuning, is a Retune for Ready to emit before anything else.
	retune   Collectives
	retuning bool
}

// op is one name waiting for submissions. Ops are pooled: the steady state allocates none.
type op struct {
	name      string
	kind      OpKind // as first submitted, for messages before negotiation
	group     int64
	groupSize int
	since     time.Time
	lastWarn  time.Time
	warned    bool
	prev      *op
	next      *op
	inMap     bool
	hint      *cacheEntry // the live entry whose pending field points here

	sent    []uint8 // per rank: subAbsent, subFull, ...
	n       int
	via     []*cacheEntry // per rank: the entry a subOther submission named
	reqs    []Request     // per rank: full submissions (allocated on first use)
	hasFull bool          // reqs holds something to clear
	hasVia  bool          // via holds something to clear
	first   *cacheEntry
	allSame bool // every submission so far named first
	err     string
	cause   Cause // with err: what kind of failure
	ended   []int // with err: the ranks that ended (reached shutdown) without submitting it
}

// How a rank submitted an op. The common case, every rank sending the same cache id, writes one
// byte per rank and no pointers.
const (
	subAbsent uint8 = iota
	subFull         // in op.reqs
	subFirst        // as the id of op.first
	subOther        // as the id of op.via[rank]
)

// item is a resolved op (or Join) waiting to be fused and emitted.
type item struct {
	sig       *opSig
	entry     *cacheEntry // every rank sent this entry's id
	kind      OpKind
	group     int64
	groupSize int

	joined []int // joined ranks that did not submit

	err      string
	cause    Cause // Response.Cause
	ended    []int // Response.Ended
	names    []string
	cacheIDs []uint32 // unknown-cache-id errors
	resync   uint64   // Response.Resync

	isJoin     bool
	lastJoined int
}

// groupState collects the members of one Group until all are ready.
type groupState struct {
	id        int64
	size      int
	held      []*item
	accounted int // members resolved, ready or failed
	failed    string
	cause     Cause // with failed: its cause
	since     time.Time
	lastWarn  time.Time
	warned    bool
	done      bool
}

// NewCoordinator makes the Coordinator for cfg.Size ranks.
func NewCoordinator(cfg Config) (*Coordinator, error) {
	if cfg.Size < 1 {
		return nil, fmt.Errorf("negotiate: coordinator for %d ranks: need at least 1", cfg.Size)
	}
	if cfg.Ranks != nil && len(cfg.Ranks) != cfg.Size {
		return nil, fmt.Errorf("negotiate: coordinator for %d ranks given %d job ranks %v", cfg.Size, len(cfg.Ranks), cfg.Ranks)
	}
	cfg = cfg.withDefaults()
	return &Coordinator{
		cfg:    cfg,
		size:   cfg.Size,
		ids:    jobRanks(slices.Clone(cfg.Ranks)),
		byName: map[string]*op{},
		groups: map[int64]*groupState{},
		joined: make([]bool, cfg.Size),
		ended:  make([]bool, cfg.Size),
		seen:   make([]uint64, cfg.Size),
		last:   make([]time.Time, cfg.Size),
		cache:  newCoordCache(cfg.CacheCapacity),
	}, nil
}

// Pending is the number of ops some but not all ranks have submitted.
func (c *Coordinator) Pending() int { return c.count }

// SetFusionBytes changes the fusion threshold (Config.FusionBytes: 0 the default, negative never
// fuse) of the responses emitted from now on, as the autotuner does between its samples. Only the
// coordinator fuses, so the ranks need not be told.
func (c *Coordinator) SetFusionBytes(n int64) {
	c.cfg.FusionBytes = n
	c.cfg = c.cfg.withDefaults()
}

// SetCacheOff turns the response cache off (or back on) from the next Response on, for the
// autotuner's trial of a job without it. Off, each op whose signature has an entry evicts it in
// the Response that answers it, and no op gets a new id: every rank drops the entry at that
// point of the stream, as for any eviction, and from then on sends the op in full. Nothing else
// has to agree: a rank still sending an id the cache dropped is answered through its tombstone.
// On again, ops get ids as they did. No effect with the cache disabled by capacity.
func (c *Coordinator) SetCacheOff(off bool) { c.cache.off = off }

// Missing sets missing[r] for every rank r (a job rank: Config.Ranks) that some rank waits on: it
// has not submitted an op another rank submitted, and has neither joined nor ended. The engine
// watches that such ranks still run. It costs a walk of the pending ops; it allocates nothing.
func (c *Coordinator) Missing(missing []bool) {
	for o := c.head; o != nil; o = o.next {
		for r, how := range o.sent {
			if how == subAbsent && !c.joined[r] && !c.ended[r] {
				if j := c.ids.of(r); j >= 0 && j < len(missing) {
					missing[j] = true
				}
			}
		}
	}
}

// Waiting sets waiting[r] for every rank r (a job rank: Config.Ranks) that has submitted something
// this Coordinator has not answered: an op others have not submitted yet, a member of a group
// whose other members are not ready (every rank submitted those), or a Join. The engine keeps such
// ranks told that rank 0 is alive. It costs a walk of the pending ops; it allocates nothing.
func (c *Coordinator) Waiting(waiting []bool) {
	mark := func(r int) {
		if r = c.ids.of(r); r >= 0 && r < len(waiting) {
			waiting[r] = true
		}
	}
	for o := c.head; o != nil; o = o.next {
		for r, how := range o.sent {
			if how != subAbsent {
				mark(r)
			}
		}
	}
	for _, g := range c.groupOrder {
		if !g.done && g.failed == "" && len(g.held) > 0 {
			for r := range c.size {
				mark(r)
			}
			break
		}
	}
	if c.joinedCount > 0 {
		for r, j := range c.joined {
			if j {
				mark(r)
			}
		}
	}
}

// Submit takes full requests from rank (with no news of what it has learned: see SubmitBatch).
func (c *Coordinator) Submit(now time.Time, rank int, reqs ...Request) error {
	return c.SubmitBatch(now, &Batch{Rank: rank, Seen: c.seenOf(rank), Requests: reqs})
}

// SubmitCached takes ops rank sent as cache ids, looked up after it had learned seen Responses.
func (c *Coordinator) SubmitCached(now time.Time, rank int, seen uint64, ids ...uint32) error {
	return c.SubmitBatch(now, &Batch{Rank: rank, Seen: seen, Cached: ids})
}

func (c *Coordinator) seenOf(rank int) uint64 {
	if rank >= 0 && rank < c.size {
		return c.seen[rank]
	}
	return 0
}

// SubmitBatch takes everything in one rank's message: full requests, then cached ids, then Join.
func (c *Coordinator) SubmitBatch(now time.Time, b *Batch) error {
	if b.Rank < 0 || b.Rank >= c.size {
		return fmt.Errorf("negotiate: batch from rank %d of %d ranks: rank out of range", b.Rank, c.size)
	}
	if b.Seen > c.seq {
		return fmt.Errorf("negotiate: batch from rank %d says it learned response %d, but only %d were sent", b.Rank, b.Seen, c.seq)
	}
	if b.Seen > c.seen[b.Rank] {
		c.seen[b.Rank] = b.Seen
	}
	if len(b.Requests) > 0 || len(b.Cached) > 0 || b.Join {
		c.last[b.Rank] = now
	}
	for i := range b.Requests {
		c.submitFull(now, b.Rank, &b.Requests[i])
	}
	for _, id := range b.Cached {
		c.submitCached(now, b.Rank, b.Seen, id)
	}
	if b.Join {
		c.join(now, b.Rank)
	}
	c.failConflictingGroups(now)
	return nil
}

// find returns the pending op for name, if any.
func (c *Coordinator) find(name string) *op {
	if o := c.byName[name]; o != nil {
		return o
	}
	if e := c.cache.byName[name]; e != nil {
		return e.pending
	}
	return nil
}

// newOp starts collecting submissions for name; hint is the live cache entry for name, if any.
func (c *Coordinator) newOp(now time.Time, name string, kind OpKind, hint *cacheEntry) *op {
	var o *op
	if n := len(c.pool); n > 0 {
		o = c.pool[n-1]
		c.pool = c.pool[:n-1]
	} else {
		o = &op{sent: make([]uint8, c.size), via: make([]*cacheEntry, c.size)}
	}
	o.name, o.kind, o.since = name, kind, now
	if hint != nil {
		o.hint = hint
		hint.pending = o
	} else {
		c.byName[name] = o
		o.inMap = true
	}
	o.prev = c.tail
	if c.tail != nil {
		c.tail.next = o
	} else {
		c.head = o
	}
	c.tail = o
	c.count++
	return o
}

func (c *Coordinator) removeOp(o *op) {
	if o.prev != nil {
		o.prev.next = o.next
	} else {
		c.head = o.next
	}
	if o.next != nil {
		o.next.prev = o.prev
	} else {
		c.tail = o.prev
	}
	if o.inMap {
		delete(c.byName, o.name)
	}
	if o.hint != nil && o.hint.pending == o {
		o.hint.pending = nil
	}
	c.count--
}

func (c *Coordinator) recycle(o *op) {
	clear(o.sent)
	if o.hasVia {
		clear(o.via)
	}
	if o.hasFull {
		clear(o.reqs)
	}
	// Field by field: a whole-struct assignment costs a bulk write barrier per op while the GC runs.
	o.name, o.err, o.cause, o.ended = "", "", Failed, nil
	o.kind, o.group, o.groupSize, o.n = 0, 0, 0, 0
	o.since, o.lastWarn, o.warned = time.Time{}, time.Time{}, false
	o.prev, o.next, o.hint, o.first = nil, nil, nil, nil
	o.inMap, o.allSame, o.hasFull, o.hasVia = false, false, false, false
	c.pool = append(c.pool, o)
}

func (c *Coordinator) submitFull(now time.Time, rank int, r *Request) {
	o := c.find(r.Name)
	if o == nil {
		o = c.newOp(now, r.Name, r.Kind, c.cache.byName[r.Name])
		o.group, o.groupSize = r.Group, r.GroupSize
	}
	if c.mark(o, rank, subFull) {
		if o.reqs == nil {
			o.reqs = make([]Request, c.size)
		}
		o.reqs[rank] = *r
		o.hasFull = true
		o.allSame = false
		c.submitted(now, o, rank)
	}
}

// submitted completes o if it can, after rank's submission; a rank that submitted the shutdown
// barrier has ended.
func (c *Coordinator) submitted(now time.Time, o *op, rank int) {
	shutdown := isShutdown(o) // o may be recycled once complete
	c.maybeComplete(now, o)
	if shutdown {
		c.end(now, rank)
	}
}

func (c *Coordinator) submitCached(now time.Time, rank int, seen uint64, id uint32) {
	e := c.cache.resolve(id, seen)
	if e == nil {
		c.route(now, &item{
			err: fmt.Sprintf("rank %d sent cache id %d, which stood for no op after the %d responses it had learned (its cache disagrees with the coordinator's)",
				c.ids.of(rank), id, seen),
			cacheIDs: []uint32{id},
		})
		return
	}
	var o *op
	if e.live {
		o = e.pending
		if o == nil {
			o = c.newOp(now, e.sig.name, e.sig.kind, e)
		}
	} else if o = c.find(e.sig.name); o == nil {
		o = c.newOp(now, e.sig.name, e.sig.kind, c.cache.byName[e.sig.name])
	}
	how := subFirst
	if o.n == 0 {
		o.group, o.groupSize = e.sig.group, e.sig.groupSize
		o.first, o.allSame = e, true
	} else if e != o.first {
		o.allSame = false
		how = subOther
	}
	if c.mark(o, rank, how) {
		if how == subOther {
			o.via[rank], o.hasVia = e, true
		}
		c.submitted(now, o, rank)
	}
}

// mark records rank's submission of o, or o's error if rank already submitted it.
func (c *Coordinator) mark(o *op, rank int, how uint8) bool {
	if o.sent[rank] != subAbsent {
		if o.err == "" {
			o.err = fmt.Sprintf("%s %q: duplicate name: rank %d submitted it again before it completed", o.kind, o.name, c.ids.of(rank))
			o.cause = Mismatch
		}
		return false
	}
	if c.joined[rank] && o.err == "" {
		o.err = fmt.Sprintf("%s %q: rank %d submitted it after joining", o.kind, o.name, c.ids.of(rank))
		o.cause = Mismatch
	}
	o.sent[rank] = how
	o.n++
	return true
}

// isShutdown reports whether o is the barrier ranks pass on their way out.
func isShutdown(o *op) bool { return o.name == ShutdownName && o.kind == Barrier }

// End records that rank will submit nothing more in this set: it reached shutdown. Every op
// pending or submitted later that it has not submitted fails at once, naming it, instead of
// waiting for the stall inspector (a rank whose program finished early must not hold the
// others until then). The Hub ends a rank in every set once it reaches the global set's shutdown.
func (c *Coordinator) End(now time.Time, rank int) error {
	if rank < 0 || rank >= c.size {
		return fmt.Errorf("negotiate: end of rank %d of %d ranks: rank out of range", rank, c.size)
	}
	c.end(now, rank)
	return nil
}

func (c *Coordinator) end(now time.Time, rank int) {
	if c.ended[rank] {
		return
	}
	c.ended[rank] = true
	c.endedCount++
	for o := c.head; o != nil; {
		next := o.next
		c.maybeComplete(now, o)
		o = next
	}
}

// Ended reports whether rank reached shutdown.
func (c *Coordinator) Ended(rank int) bool { return c.ended[rank] }

// maybeComplete resolves o once every rank has submitted it or joined, or fails it once a rank
// that will never submit it has ended.
func (c *Coordinator) maybeComplete(now time.Time, o *op) {
	n := o.n
	if c.joinedCount > 0 {
		for r, j := range c.joined {
			if j && o.sent[r] == subAbsent {
				n++
			}
		}
	}
	if n == c.size {
		c.resolve(now, o)
		return
	}
	if c.endedCount > 0 && !isShutdown(o) {
		var gone []int
		for r, e := range c.ended {
			if e && o.sent[r] == subAbsent && !c.joined[r] {
				gone = append(gone, c.ids.of(r))
			}
		}
		if len(gone) > 0 {
			if o.err == "" {
				o.err = fmt.Sprintf("%s %q: %s ended without submitting it (reached shutdown: its program finished or called shutdown)",
					o.kind, o.name, rankWord(gone))
				o.ended = gone
			}
			c.resolve(now, o)
		}
	}
}

// noteGroupConflict records, when the ranks present in a failed op declared different groups
// (grouped calls of different lengths on different ranks), that each rank submits none of the
// members of the groups the others declared; failConflictingGroups then fails those members.
func (c *Coordinator) noteGroupConflict(reqs []Request, present []int) {
	var ids []int64
	for _, r := range present {
		if g := reqs[r].Group; g != 0 && !slices.Contains(ids, g) {
			ids = append(ids, g)
		}
	}
	if len(ids) < 2 {
		return
	}
	if c.conflicts == nil {
		c.conflicts = map[int64][]bool{}
	}
	for _, id := range ids {
		never := c.conflicts[id]
		if never == nil {
			never = make([]bool, c.size)
			c.conflicts[id] = never
		}
		for _, r := range present {
			if reqs[r].Group != id {
				never[r] = true
			}
		}
	}
}

// failConflictingGroups fails the pending members of conflicting groups (noteGroupConflict) that
// miss a rank which declared another group: they would wait for it forever. It runs once a Batch
// is in, when every member of each rank's grouped call is pending.
func (c *Coordinator) failConflictingGroups(now time.Time) {
	if len(c.conflicts) == 0 {
		return
	}
	for o := c.head; o != nil; {
		next := o.next
		if never := c.conflicts[o.group]; never != nil {
			var absent []int
			for r, how := range o.sent {
				if how == subAbsent && never[r] && !c.joined[r] {
					absent = append(absent, r)
				}
			}
			if len(absent) > 0 {
				if o.err == "" {
					o.err = fmt.Sprintf("%s %q: %s declared another group, of another length, for the same grouped call",
						o.kind, o.name, c.ids.word(absent))
					o.cause = Mismatch
				}
				c.resolve(now, o)
			}
		}
		o = next
	}
	clear(c.conflicts)
}

// resolve negotiates a complete op and queues the result.
func (c *Coordinator) resolve(now time.Time, o *op) {
	c.removeOp(o)
	var it *item
	if n := len(c.itemPool); n > 0 {
		it = c.itemPool[n-1]
		c.itemPool = c.itemPool[:n-1]
	} else {
		it = new(item)
	}
	it.kind, it.group, it.groupSize = o.kind, o.group, o.groupSize
	switch {
	case o.err != "":
		it.err, it.cause, it.names, it.ended = o.err, o.cause, []string{o.name}, o.ended
	case o.allSame && c.joinedCount == 0:
		// Every rank sent the same cache id: the signature was negotiated before, unchanged.
		it.sig, it.entry = o.first.sig, o.first
		it.group, it.groupSize = it.sig.group, it.sig.groupSize
	default:
		var present, absent []int
		for r := 0; r < c.size; r++ {
			if o.sent[r] != subAbsent {
				present = append(present, r)
			} else {
				absent = append(absent, r)
			}
		}
		if o.reqs == nil {
			o.reqs = make([]Request, c.size)
		}
		for _, r := range present {
			switch o.sent[r] {
			case subFirst:
				o.reqs[r] = o.first.sig.requestFor(r)
			case subOther:
				o.reqs[r] = o.via[r].sig.requestFor(r)
			}
		}
		o.hasFull = true
		first := &o.reqs[present[0]]
		it.kind, it.group, it.groupSize = first.Kind, first.Group, first.GroupSize
		sig, err := negotiate(o.name, c.size, o.reqs, present, absent, c.ids)
		if err != "" {
			it.err, it.cause, it.names = err, Mismatch, []string{o.name}
			c.noteGroupConflict(o.reqs, present)
		} else {
			it.sig, it.joined = sig, absent
			it.group, it.groupSize = sig.group, sig.groupSize
		}
	}
	c.recycle(o)
	c.route(now, it)
}

// route queues a resolved item, holding grouped ops back until their whole group is resolved.
func (c *Coordinator) route(now time.Time, it *item) {
	if it.group == 0 || it.groupSize < 1 || it.isJoin {
		c.ready = append(c.ready, it)
		return
	}
	g := c.groups[it.group]
	if g == nil {
		g = &groupState{id: it.group, size: it.groupSize, since: now}
		c.groups[it.group] = g
		c.groupOrder = append(c.groupOrder, g)
	}
	g.accounted++
	switch {
	case g.failed != "":
		c.ready = append(c.ready, &item{kind: it.kind, names: it.itemNames(), cause: g.cause,
			err: fmt.Sprintf("%s %q: its group %d failed: %s", it.kind, it.itemNames()[0], g.id, g.failed)})
	case it.err != "":
		c.failGroup(g, it.kind, it.err, it.cause, it.itemNames())
	default:
		if it.sig.groupSize != g.size {
			c.failGroup(g, it.kind, fmt.Sprintf("%s %q: group %d: declared with %d members, but another member declared %d",
				it.kind, it.sig.name, g.id, it.sig.groupSize, g.size), Mismatch, []string{it.sig.name})
			break
		}
		g.held = append(g.held, it)
		if len(g.held) == 1 {
			g.since = now
		}
	}
	if g.accounted >= g.size && g.size > 0 {
		if g.failed == "" {
			c.ready = append(c.ready, g.held...)
		}
		g.done, g.held = true, nil
		delete(c.groups, g.id)
	}
}

func (it *item) itemNames() []string {
	if it.sig != nil {
		return []string{it.sig.name}
	}
	return it.names
}

// failGroup fails the held members of g, and the next ones when they come, with msg (of cause).
func (c *Coordinator) failGroup(g *groupState, kind OpKind, msg string, cause Cause, names []string) {
	all := make([]string, 0, len(g.held)+len(names))
	for _, h := range g.held {
		all = append(all, h.sig.name)
	}
	all = append(all, names...)
	c.ready = append(c.ready, &item{kind: kind, names: all, err: msg, cause: cause})
	g.failed, g.cause, g.held = msg, cause, nil
}

// Join records that rank will submit nothing more until every rank has joined. Ops every other
// rank submits become ready without it (its executor contributes zeros, or nothing); when the last
// rank joins, a Join Response names it and the joined set starts empty again. Joining twice is a
// no-op.
func (c *Coordinator) Join(now time.Time, rank int) error {
	if rank < 0 || rank >= c.size {
		return fmt.Errorf("negotiate: join from rank %d of %d ranks: rank out of range", rank, c.size)
	}
	c.join(now, rank)
	return nil
}

func (c *Coordinator) join(now time.Time, rank int) {
	if c.joined[rank] {
		return
	}
	c.joined[rank] = true
	c.joinedCount++
	for o := c.head; o != nil; {
		next := o.next
		c.maybeComplete(now, o)
		o = next
	}
	if c.joinedCount == c.size {
		c.ready = append(c.ready, &item{kind: Join, isJoin: true, lastJoined: rank})
		clear(c.joined)
		c.joinedCount = 0
	}
}

// Tick runs the stall inspector at time now, then returns Ready(): the error Responses of ops it
// gave up on come out in stream order with everything else.
func (c *Coordinator) Tick(now time.Time) ([]Response, []Stall) {
	var stalls []Stall
	warn, shut := c.cfg.StallWarning, c.cfg.StallShutdown
	due := func(since, last time.Time, warned bool) bool {
		return warn > 0 && now.Sub(since) >= warn && (!warned || now.Sub(last) >= warn)
	}
	stalls = c.failCrossed(now, stalls)
	for o := c.head; o != nil; {
		next := o.next
		waited := now.Sub(o.since)
		fatal := shut > 0 && waited >= shut
		if fatal || due(o.since, o.lastWarn, o.warned) {
			s := Stall{Name: o.name, Kind: o.kind, Since: waited, Fatal: fatal}
			for r := 0; r < c.size; r++ {
				switch {
				case o.sent[r] != subAbsent:
					s.Ready = append(s.Ready, c.ids.of(r))
				case !c.joined[r]:
					s.Missing = append(s.Missing, c.ids.of(r))
				}
			}
			stalls = append(stalls, s)
			o.warned, o.lastWarn = true, now
			if fatal {
				if o.err == "" {
					o.err = fmt.Sprintf("%s %q: %s never submitted it within %v (submitted by %s)",
						o.kind, o.name, rankWord(s.Missing), shut, rankWord(s.Ready))
				}
				c.resolve(now, o)
			}
		}
		o = next
	}
	live := c.groupOrder[:0]
	for _, g := range c.groupOrder {
		if g.done || g.failed != "" {
			continue
		}
		live = append(live, g)
		if len(g.held) == 0 {
			continue
		}
		waited := now.Sub(g.since)
		fatal := shut > 0 && waited >= shut
		if !fatal && !due(g.since, g.lastWarn, g.warned) {
			continue
		}
		h := g.held[0].sig
		stalls = append(stalls, Stall{Name: h.name, Kind: h.kind, Since: waited, Fatal: fatal,
			Reason: fmt.Sprintf("group %d has %d of %d members ready on every rank", g.id, len(g.held), g.size)})
		g.warned, g.lastWarn = true, now
		if fatal {
			c.failGroup(g, h.kind, fmt.Sprintf("%s %q: group %d: only %d of %d members were ready on every rank within %v",
				h.kind, h.name, g.id, len(g.held), g.size, shut), Failed, nil)
		}
	}
	clear(c.groupOrder[len(live):])
	c.groupOrder = live
	return c.Ready(), stalls
}

// failCrossed fails the ops that have waited StallCrossed while every rank missing from them has
// ops of its own pending, unchanged for as long (see Config.StallCrossed), and appends their
// stalls. Every such op is failed in the same tick, so that each rank gets an error for the op it
// waits on.
func (c *Coordinator) failCrossed(now time.Time, stalls []Stall) []Stall {
	cross := c.cfg.StallCrossed
	if cross <= 0 {
		return stalls
	}
	due := false
	for o := c.head; o != nil && !due; o = o.next {
		due = now.Sub(o.since) >= cross
	}
	if !due {
		return stalls // the usual tick: nothing has waited that long, and nothing is allocated
	}
	waiting := map[int][]*op{} // per rank: the ops it submitted that are pending, oldest first
	for p := c.head; p != nil; p = p.next {
		for r := range c.size {
			if p.sent[r] != subAbsent {
				waiting[r] = append(waiting[r], p)
			}
		}
	}
	// crossedOp reports o's submitters and missing ranks, and whether o is crossed: every rank
	// missing from it waits on ops of its own. With partnerOf nil the op must have waited
	// StallCrossed and its missing ranks have submitted nothing for as long; otherwise it is
	// enough that each missing rank waits on an op of partnerOf (one found crossed this tick).
	crossedOp := func(o *op, partnerOf map[*op]bool) (ready, missing []int, ok bool) {
		if partnerOf == nil && now.Sub(o.since) < cross {
			return nil, nil, false
		}
		for r := range c.size {
			switch {
			case o.sent[r] != subAbsent:
				ready = append(ready, r)
			case c.joined[r]:
			case len(waiting[r]) == 0:
				return nil, nil, false // r submitted nothing pending: it may be busy elsewhere
			case partnerOf == nil && now.Sub(c.last[r]) < cross:
				return nil, nil, false // r submitted lately: it may be on its way
			case partnerOf != nil && !slices.ContainsFunc(waiting[r], func(p *op) bool { return partnerOf[p] }):
				return nil, nil, false
			default:
				missing = append(missing, r)
			}
		}
		return ready, missing, len(missing) > 0
	}
	found := map[*op]bool{}
	for o := c.head; o != nil; o = o.next {
		if _, _, ok := crossedOp(o, nil); ok {
			found[o] = true
		}
	}
	if len(found) == 0 {
		return stalls
	}
	// The ops the crossed ops' missing ranks wait on are crossed with them, though they may be a
	// little younger, or their missing ranks' last submission a little later (the same op from two
	// ranks arrives at two moments): they fail in the same tick, or a rank would get one error now
	// and another for its next call a tick later.
	first := maps.Clone(found)
	for o := c.head; o != nil; o = o.next {
		if !found[o] {
			if _, _, ok := crossedOp(o, first); ok {
				found[o] = true
			}
		}
	}
	var failed []*op
	var msgs []string
	for o := c.head; o != nil; o = o.next {
		if !found[o] {
			continue
		}
		ready, missing, _ := crossedOp(o, found)
		if len(missing) == 0 {
			ready, missing, _ = crossedOp(o, nil)
		}
		// What each missing rank waits on, grouped: "ranks 1,2 wait on barrier "noname.7"".
		elsewhere := tally(missing, func(r int) string {
			var names []string
			for i, p := range waiting[r] {
				if i == 3 {
					names = append(names, fmt.Sprintf("and %d more", len(waiting[r])-3))
					break
				}
				names = append(names, fmt.Sprintf("%s %q", p.kind, p.name))
			}
			return strings.Join(names, ", ")
		})
		parts := make([]string, len(elsewhere))
		for i, v := range elsewhere {
			verb := " waits on "
			if len(v.ranks) > 1 {
				verb = " wait on "
			}
			parts[i] = c.ids.word(v.ranks) + verb + v.key
		}
		msgs = append(msgs, fmt.Sprintf("%s %q: the ranks' calls went different ways: %s submitted it, but %s instead (for %v and more, with nothing else submitted); a rank that raised or skipped a call moved on, and unnamed ops are matched by call order",
			o.kind, o.name, c.ids.word(ready), strings.Join(parts, "; "), cross))
		failed = append(failed, o)
		stalls = append(stalls, Stall{Name: o.name, Kind: o.kind, Since: now.Sub(o.since), Fatal: true,
			Ready: c.ids.all(ready), Missing: c.ids.all(missing), Reason: "crossed: " + strings.Join(parts, "; ")})
	}
	if len(failed) == 0 {
		return stalls
	}
	// Past every unnamed op pending now: the ranks blocked in these ops have submitted nothing
	// later, so no rank has counted beyond it.
	var resync uint64
	for o := c.head; o != nil; o = o.next {
		if n, ok := unnamedNumber(o.name); ok && n+1 > resync {
			resync = n + 1
		}
	}
	names := make([]string, len(failed))
	for i, o := range failed {
		names[i] = o.name // resolve recycles o
		if o.err == "" {
			o.err = msgs[i]
		}
		c.resolve(now, o)
	}
	for _, it := range c.ready {
		if it.err != "" && slices.ContainsFunc(names, func(n string) bool { return slices.Contains(it.names, n) }) {
			it.resync = resync
		}
	}
	return stalls
}

// unnamedNumber is N of an unnamed op's name ("noname.<N>", or "noname.<N>.<i>" for a member of
// a group), as the API layer names them.
func unnamedNumber(name string) (uint64, bool) {
	rest, ok := strings.CutPrefix(name, "noname.")
	if !ok {
		return 0, false
	}
	if i := strings.IndexByte(rest, '.'); i >= 0 {
		rest = rest[:i]
	}
	n, err := strconv.ParseUint(rest, 10, 64)
	return n, err == nil
}

// Ready returns the Responses resolved since the last call, in stream order: ops in the order they
// became ready, each fused with later compatible ones (same kind, dtype, reduce op, scale
// factors, root, group and joined ranks) while the group stays within FusionBytes, first fit.
// Allreduce, Allgather, Broadcast and ReduceScatter fuse; Alltoall, Barrier and errors go alone.
func (c *Coordinator) Ready() []Response {
	items := c.ready
	if len(items) == 0 && !c.retuning {
		return nil
	}
	out := make([]Response, 0, 1)
	if c.retuning {
		c.seq++
		out = append(out, Response{Seq: c.seq, Kind: Retune, Tune: c.retune})
		c.retuning = false
	}
	if cap(c.used) < len(items) {
		c.used = make([]bool, len(items))
	}
	used := c.used[:len(items)]
	clear(used)
	var members []*item
	for i, it := range items {
		if used[i] {
			continue
		}
		used[i] = true
		switch {
		case it.err != "":
			c.seq++
			out = append(out, Response{Seq: c.seq, Kind: it.kind, Names: it.names, Error: it.err, Ended: it.ended,
				Cause: it.cause, CacheIDs: it.cacheIDs, Resync: it.resync})
			continue
		case it.isJoin:
			c.seq++
			out = append(out, Response{Seq: c.seq, Kind: Join, LastJoined: it.lastJoined})
			continue
		}
		members = append(members[:0], it)
		if c.fuses(it.sig.kind) {
			total := it.sig.bytes
			for j := i + 1; j < len(items); j++ {
				o := items[j]
				if used[j] || o.sig == nil || !sameFusionKey(it, o) {
					continue
				}
				if it.sig.group == 0 && satAdd(total, o.sig.bytes) > c.cfg.FusionBytes {
					continue
				}
				total = satAdd(total, o.sig.bytes)
				used[j] = true
				members = append(members, o)
			}
		}
		out = append(out, c.emit(members))
	}
	for i, it := range items {
		*it = item{}
		c.itemPool = append(c.itemPool, it)
		items[i] = nil
	}
	c.ready = items[:0]
	return out
}

// Retune has the next Ready (or Tick) emit a Retune response with s ahead of every op: the ops it
// emits from then on run under s on every rank. Of two Retunes before a Ready, the last counts.
func (c *Coordinator) Retune(s Collectives) {
	c.retune, c.retuning = s, true
}

func (c *Coordinator) fuses(k OpKind) bool {
	return c.cfg.FusionBytes > 0 && (k == Allreduce || k == Allgather || k == Broadcast || k == ReduceScatter)
}

func sameFusionKey(a, b *item) bool {
	x, y := a.sig, b.sig
	return x.kind == y.kind && x.dtype == y.dtype && x.reduceOp == y.reduceOp && x.average == y.average && x.gpu == y.gpu &&
		x.pre == y.pre && x.post == y.post && x.root == y.root && x.group == y.group &&
		x.groupSize == y.groupSize && slices.Equal(a.joined, b.joined)
}

// emit assigns the next Seq to one fused group and settles its cache ids.
func (c *Coordinator) emit(members []*item) Response {
	c.seq++
	s0 := members[0].sig
	n := len(members)
	r := Response{Seq: c.seq, Kind: s0.kind, DType: s0.dtype, ReduceOp: s0.reduceOp, Average: s0.average,
		GPU: s0.gpu, PreScale: s0.pre, PostScale: s0.post, Root: s0.root, Group: s0.group, GroupSize: s0.groupSize,
		Joined: members[0].joined, Names: make([]string, n), Shapes: make([][]int64, n)}
	if s0.kind == Allgather {
		r.Dim0 = make([][]int64, n)
	}
	if s0.kind == Alltoall {
		r.Splits = s0.splits
	}
	var ids []uint32
	fromCache := c.cache.enabled()
	if fromCache {
		ids = make([]uint32, n)
	}
	anyID := false
	for i, it := range members {
		s := it.sig
		r.Names[i], r.Shapes[i] = s.name, s.shape
		if r.Dim0 != nil {
			r.Dim0[i] = s.dim0
		}
		if ids == nil {
			continue
		}
		var hit bool
		ids[i], hit = c.cacheFor(it, &r)
		fromCache = fromCache && hit
		anyID = anyID || ids[i] != NoCacheID
	}
	if anyID {
		r.CacheIDs = ids
	}
	r.FromCache = fromCache && anyID
	return r
}

// cacheFor returns the id that stands for it's signature after Response r, and whether every rank
// already held it; new ids and evictions are recorded in r.
func (c *Coordinator) cacheFor(it *item, r *Response) (uint32, bool) {
	s := it.sig
	if s.partial {
		return NoCacheID, false
	}
	if c.cache.off {
		if e := c.cache.byName[s.name]; e != nil {
			c.evict(e, r)
		}
		return NoCacheID, false
	}
	if e := it.entry; e != nil && e.live {
		c.cache.touch(e, r.Seq)
		return e.id, true
	}
	if e := c.cache.byName[s.name]; e != nil {
		if sigEqual(e.sig, s) {
			c.cache.touch(e, r.Seq)
			return e.id, true
		}
		c.evict(e, r)
	}
	if c.cache.live >= c.cache.capacity {
		if v := c.cache.tail; v != nil && v.touched != r.Seq {
			c.evict(v, r)
		}
	}
	return c.cache.assign(s, r.Seq, c.minSeen), false
}

// evict drops e from the cache in Response r; an op still collecting submissions for e's name
// moves to byName, where full requests will find it.
func (c *Coordinator) evict(e *cacheEntry, r *Response) {
	if o := e.pending; o != nil {
		o.hint = nil
		if !o.inMap {
			c.byName[o.name] = o
			o.inMap = true
		}
	}
	c.cache.evict(e, r.Seq)
	r.Evict = append(r.Evict, e.id)
}

func (c *Coordinator) minSeen() uint64 {
	m := c.seq
	for _, s := range c.seen {
		m = min(m, s)
	}
	return m
}
