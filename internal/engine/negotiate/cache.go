package negotiate

import (
	"fmt"
	"slices"
)

// The response cache. The Coordinator owns the truth: it gives each successfully negotiated
// signature an id, evicts the least recently used entry when full, and announces both in
// Responses. Every rank's Cache replays those announcements in stream order, so all caches hold
// the same table, and a rank whose request matches its entry sends just the id.
//
// A rank may send an id that the Coordinator has since evicted, because the Response announcing the
// eviction was still on its way. Each Batch therefore says how many Responses its rank had learned
// (Seen); the Coordinator keeps an evicted entry (a tombstone) until every rank has learned the
// eviction, resolves such late ids through it, and only then reuses the id. An id no rank could
// legitimately send is answered with an error Response.

// cacheEntry is one id's signature on the Coordinator. Entries are never modified in place: reusing
// an id makes a new entry, so pending ops can keep pointers to what a rank meant.
type cacheEntry struct {
	id         uint32
	sig        *opSig
	live       bool
	bornSeq    uint64 // the Response that announced it
	evictedSeq uint64 // the Response that evicted it (tombstones)
	touched    uint64 // the last Response that used it
	prev, next *cacheEntry
	// pending is the op now collecting submissions for sig.name, found without hashing the name.
	pending *op
}

type coordCache struct {
	capacity int // live entries; 0: disabled
	// off: the autotuner turned the cache off for now (Coordinator.SetCacheOff).
	off    bool
	limit  uint32
	slots  []*cacheEntry // by id: live entries and tombstones
	byName map[string]*cacheEntry
	head   *cacheEntry // most recently used live entry
	tail   *cacheEntry
	live   int
	tombs  []*cacheEntry // by evictedSeq
	free   []uint32
	next   uint32 // ids below next have been handed out at least once
}

func newCoordCache(capacity int) coordCache {
	if capacity < 0 {
		capacity = 0
	}
	lim := cacheIDLimit(capacity)
	return coordCache{capacity: capacity, limit: lim, slots: make([]*cacheEntry, lim), byName: map[string]*cacheEntry{}}
}

func (c *coordCache) enabled() bool { return c.capacity > 0 }

// resolve finds what id meant to a rank that had learned seen Responses, or nil if no such rank
// could have sent it.
func (c *coordCache) resolve(id uint32, seen uint64) *cacheEntry {
	if id >= c.limit {
		return nil
	}
	e := c.slots[id]
	if e == nil || e.bornSeq > seen {
		return nil
	}
	if !e.live && seen >= e.evictedSeq {
		return nil
	}
	return e
}

func (c *coordCache) unlink(e *cacheEntry) {
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		c.head = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		c.tail = e.prev
	}
	e.prev, e.next = nil, nil
}

func (c *coordCache) pushFront(e *cacheEntry) {
	e.next = c.head
	if c.head != nil {
		c.head.prev = e
	}
	c.head = e
	if c.tail == nil {
		c.tail = e
	}
}

func (c *coordCache) touch(e *cacheEntry, seq uint64) {
	e.touched = seq
	if c.head != e {
		c.unlink(e)
		c.pushFront(e)
	}
}

func (c *coordCache) evict(e *cacheEntry, seq uint64) {
	c.unlink(e)
	e.live = false
	e.evictedSeq = seq
	e.pending = nil
	delete(c.byName, e.sig.name)
	c.live--
	c.tombs = append(c.tombs, e)
}

// reclaim frees the ids of tombstones every rank has learned about (minSeen: the least Seen).
func (c *coordCache) reclaim(minSeen uint64) {
	n := 0
	for n < len(c.tombs) && c.tombs[n].evictedSeq <= minSeen {
		e := c.tombs[n]
		if c.slots[e.id] == e {
			c.slots[e.id] = nil
		}
		c.free = append(c.free, e.id)
		n++
	}
	if n > 0 {
		c.tombs = slices.Delete(c.tombs, 0, n)
	}
}

// assign gives sig a new id in Response seq, or NoCacheID when the cache is full (the caller
// evicts first) or no id is free yet.
func (c *coordCache) assign(sig *opSig, seq uint64, minSeen func() uint64) uint32 {
	if c.live >= c.capacity {
		return NoCacheID
	}
	if len(c.free) == 0 && len(c.tombs) > 0 {
		c.reclaim(minSeen())
	}
	var id uint32
	switch {
	case len(c.free) > 0:
		id = c.free[len(c.free)-1]
		c.free = c.free[:len(c.free)-1]
	case c.next < c.limit:
		id = c.next
		c.next++
	default:
		return NoCacheID
	}
	e := &cacheEntry{id: id, sig: sig, live: true, bornSeq: seq, touched: seq}
	c.slots[id] = e
	c.byName[sig.name] = e
	c.live++
	c.pushFront(e)
	return id
}

// table lists the live entries by id, for tests that compare every rank's cache with this one.
func (c *coordCache) table() map[uint32]*opSig {
	t := map[uint32]*opSig{}
	for e := c.head; e != nil; e = e.next {
		t[e.id] = e.sig
	}
	return t
}

// Cache is one rank's copy of the response cache: the engine of every rank (rank 0 included) keeps
// one, feeds it every Response in stream order (Learn), and asks it for the compact form of each
// request it sends (Lookup, Compact). It is not safe for concurrent use.
type Cache struct {
	rank, size int
	limit      uint32
	slots      []*opSig // by id; grown on demand up to limit
	byName     map[string]uint32
	seen       uint64
}

// NewCache makes the cache of rank out of size ranks; capacity must be the Coordinator's
// Config.CacheCapacity (0: the default; negative: no cache, every Lookup misses).
func NewCache(rank, size, capacity int) (*Cache, error) {
	if size < 1 || rank < 0 || rank >= size {
		return nil, fmt.Errorf("negotiate: cache for rank %d of %d ranks: rank out of range", rank, size)
	}
	if capacity == 0 {
		capacity = DefaultCacheCapacity
	}
	return &Cache{rank: rank, size: size, limit: cacheIDLimit(capacity), byName: map[string]uint32{}}, nil
}

// Seen is the Seq of the last Response learned: what this rank's Batches must carry.
func (c *Cache) Seen() uint64 { return c.seen }

// Len is the number of ids this rank knows.
func (c *Cache) Len() int { return len(c.byName) }

// Lookup returns the id that stands for r if this rank's entry for r.Name matches r exactly.
func (c *Cache) Lookup(r *Request) (uint32, bool) {
	if r.Error != "" {
		return NoCacheID, false // a refusal travels in full, to fail the op
	}
	id, ok := c.byName[r.Name]
	if !ok || !c.slots[id].matches(c.rank, c.size, r) {
		return NoCacheID, false
	}
	return id, true
}

// Compact appends reqs to b, each as a cache id where this rank's cache knows it, else in full, and
// stamps b with this rank and its Seen.
func (c *Cache) Compact(b *Batch, reqs ...Request) {
	b.Rank, b.Seen = c.rank, c.seen
	for i := range reqs {
		if id, ok := c.Lookup(&reqs[i]); ok {
			b.Cached = append(b.Cached, id)
		} else {
			b.Requests = append(b.Requests, reqs[i])
		}
	}
}

// Learn applies a Response: it checks its Seq follows the last one, drops the evicted ids, learns
// the announced ones, and fills in a compact Response (FromCache with no Names, as DecodeResponses
// returns it) from this rank's entries, so that r is complete when Learn returns. It also names
// the tensors of an unknown-cache-id error (Names empty, CacheIDs set) as this rank knew them ("" if
// it did not). An error means this rank's cache no longer agrees with the Coordinator's: the engine
// must treat it as fatal.
func (c *Cache) Learn(r *Response) error {
	if r.Seq != c.seen+1 {
		return fmt.Errorf("negotiate: rank %d: response %d arrived after %d: responses lost or reordered", c.rank, r.Seq, c.seen)
	}
	c.seen = r.Seq
	for _, id := range r.Evict {
		s := c.get(id)
		if s == nil {
			return fmt.Errorf("negotiate: rank %d: response %d evicts cache id %d, which this rank does not hold", c.rank, r.Seq, id)
		}
		c.slots[id] = nil
		delete(c.byName, s.name)
	}
	if r.FromCache {
		if r.Names == nil {
			return c.expand(r)
		}
		return nil
	}
	if r.Error != "" {
		if len(r.Names) == 0 && len(r.CacheIDs) > 0 {
			r.Names = make([]string, len(r.CacheIDs))
			for i, id := range r.CacheIDs {
				if s := c.get(id); s != nil {
					r.Names[i] = s.name
				}
			}
		}
		return nil
	}
	if len(r.CacheIDs) != 0 && len(r.CacheIDs) != len(r.Names) {
		return fmt.Errorf("negotiate: rank %d: response %d has %d cache ids for %d names", c.rank, r.Seq, len(r.CacheIDs), len(r.Names))
	}
	for i, id := range r.CacheIDs {
		if id == NoCacheID {
			continue
		}
		if id >= c.limit {
			return fmt.Errorf("negotiate: rank %d: response %d gives %q cache id %d, beyond this cache's %d ids (do all ranks use the same cache capacity?)", c.rank, r.Seq, r.Names[i], id, c.limit)
		}
		if s := c.get(id); s != nil {
			if s.name == r.Names[i] {
				continue // kept: the signature was negotiated again, unchanged
			}
			return fmt.Errorf("negotiate: rank %d: response %d gives %q cache id %d, which still stands for %q", c.rank, r.Seq, r.Names[i], id, s.name)
		}
		if old, ok := c.byName[r.Names[i]]; ok {
			return fmt.Errorf("negotiate: rank %d: response %d gives %q cache id %d, but it still has id %d", c.rank, r.Seq, r.Names[i], id, old)
		}
		s := sigFromResponse(r, i)
		if !s.validForCache(c.size) {
			return fmt.Errorf("negotiate: rank %d: response %d gives %q a cache id but lacks the per-rank data of a %s", c.rank, r.Seq, r.Names[i], r.Kind)
		}
		for uint32(len(c.slots)) <= id {
			c.slots = append(c.slots, nil)
		}
		c.slots[id] = s
		c.byName[s.name] = id
	}
	return nil
}

func (c *Cache) get(id uint32) *opSig {
	if id < uint32(len(c.slots)) {
		return c.slots[id]
	}
	return nil
}

// expand fills a compact Response from the entries its CacheIDs name.
func (c *Cache) expand(r *Response) error {
	if len(r.CacheIDs) == 0 {
		return fmt.Errorf("negotiate: rank %d: response %d is from the cache but names no cache id", c.rank, r.Seq)
	}
	r.Names = make([]string, len(r.CacheIDs))
	r.Shapes = make([][]int64, len(r.CacheIDs))
	for i, id := range r.CacheIDs {
		s := c.get(id)
		if s == nil {
			return fmt.Errorf("negotiate: rank %d: response %d uses cache id %d, which this rank does not hold", c.rank, r.Seq, id)
		}
		if i == 0 {
			if r.Kind != InvalidOp && r.Kind != s.kind {
				return fmt.Errorf("negotiate: rank %d: response %d says %s, but cache id %d stands for %s %q", c.rank, r.Seq, r.Kind, id, s.kind, s.name)
			}
			r.Kind, r.DType, r.ReduceOp, r.Average, r.GPU, r.Root = s.kind, s.dtype, s.reduceOp, s.average, s.gpu, s.root
			r.PreScale, r.PostScale, r.Group, r.GroupSize = s.pre, s.post, s.group, s.groupSize
			if s.kind == Allgather {
				r.Dim0 = make([][]int64, len(r.CacheIDs))
			}
			r.Splits = s.splits
		} else if s.kind != r.Kind || s.dtype != r.DType {
			return fmt.Errorf("negotiate: rank %d: response %d fuses cache ids %d and %d of different kinds", c.rank, r.Seq, r.CacheIDs[0], id)
		}
		r.Names[i], r.Shapes[i] = s.name, s.shape
		if r.Dim0 != nil {
			r.Dim0[i] = s.dim0
		}
	}
	return nil
}
