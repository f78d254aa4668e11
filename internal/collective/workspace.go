package collective

import "sync"

// segmentBytes bounds the scratch a reduction needs: data is exchanged and reduced in segments of
// at most this many bytes, so scratch stays small however large the buffer. It is a multiple of
// every element size, and it is a constant because both ends of a link must cut alike.
const segmentBytes = 1 << 20

// workspace is the scratch one collective call borrows: a byte buffer and a slice of slices (the
// sources of an n-way reduce).
type workspace struct {
	buf    []byte
	srcs   [][]byte
	bounds []int
}

// pool keeps a few workspaces between calls. It is a plain free list rather than a sync.Pool
// because sync.Pool may drop entries at any GC (and at random under the race detector), which
// would make the steady state allocate. It is bounded in entries and in the size of what it
// keeps, so that a burst of ops does not pin memory forever; when full it keeps the larger
// workspaces (held), which serve every smaller request. Concurrent collectives on different Comms (tests
// run every rank in one process) each take their own workspace.
var pool struct {
	mu   sync.Mutex
	free []*workspace
}

// maxPooled bounds the free list: enough for 8 ranks in one process each running an op that
// needs a workspace at two levels (hierarchical allreduce), not more.
const maxPooled = 32

// maxPooledBytes: larger workspaces are freed after use. Only ReduceScatter asks for more than
// segmentBytes (a copy of its whole input), so ring, recursive doubling, shared and hierarchical
// allreduce stay allocation-free at any size.
const maxPooledBytes = 16 << 20

// getWorkspace returns a workspace whose buf has at least nbytes bytes and whose srcs and bounds
// have room for nsrcs entries. Put it back with putWorkspace. Of the pooled ones with buf enough it
// takes one whose srcs and bounds fit too, if any, and of those the smallest buf: by buf alone, ops
// of several kinds (whose scratch differs in srcs and bounds, not buf) would keep taking and
// regrowing each other's workspaces, and allocate per op.
func getWorkspace(nbytes, nsrcs int) *workspace {
	pool.mu.Lock()
	best, bestFits := -1, false
	for i, w := range pool.free {
		if cap(w.buf) < nbytes {
			continue
		}
		fits := cap(w.srcs) >= nsrcs && cap(w.bounds) >= nsrcs+1
		if best < 0 || (fits && !bestFits) || (fits == bestFits && cap(w.buf) < cap(pool.free[best].buf)) {
			best, bestFits = i, fits
		}
	}
	var w *workspace
	if best >= 0 {
		w = pool.free[best]
		last := len(pool.free) - 1
		pool.free[best] = pool.free[last]
		pool.free[last] = nil
		pool.free = pool.free[:last]
	}
	pool.mu.Unlock()
	if w == nil {
		w = &workspace{buf: make([]byte, nbytes)}
	}
	if cap(w.srcs) < nsrcs {
		w.srcs = make([][]byte, nsrcs)
	}
	if cap(w.bounds) < nsrcs+1 {
		w.bounds = make([]int, 0, nsrcs+1)
	}
	w.buf = w.buf[:cap(w.buf)]
	w.srcs = w.srcs[:nsrcs]
	return w
}

func putWorkspace(w *workspace) {
	if cap(w.buf) > maxPooledBytes {
		return
	}
	clear(w.srcs) // do not keep callers' buffers alive
	pool.mu.Lock()
	defer pool.mu.Unlock()
	if len(pool.free) < maxPooled {
		pool.free = append(pool.free, w)
		return
	}
	smallest := 0
	for i, f := range pool.free {
		if f.held() < pool.free[smallest].held() {
			smallest = i
		}
	}
	if pool.free[smallest].held() < w.held() {
		pool.free[smallest] = w
	}
}

// held is the memory w keeps, by which a full pool chooses what to keep: a workspace with more
// room in any of buf, srcs and bounds serves requests a smaller one would regrow for.
func (w *workspace) held() int { return cap(w.buf) + 24*cap(w.srcs) + 8*cap(w.bounds) }
