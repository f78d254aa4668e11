package engine

// Negotiating small allreduces through the shared-memory board.
//
// With more ranks than cores every hop of an op waits for descheduled ranks to run, and an op
// through the coordinator makes two hops before its collective (request to rank 0, response back):
// 8 ranks on the 2-core test VM spent ~60 µs per 4-byte allreduce, nearly all of it negotiating,
// where OpenMPI's whole allreduce takes ~20 µs. On one host the ranks can negotiate without rank 0
// instead: each posts, in its block of the segment's board (transport.Board), the cache ids of the
// small allreduces it has ready and their data, and arrives at the board's round; once every rank
// has arrived, each computes the same intersection of the posted ids and reduces those ops itself
// from every rank's block, in rank order, so every rank gets the same bits. One round is one
// barrier's worth of waiting, and the op needs no collective after it.
//
// What keeps this correct next to the coordinator's path:
//   - Only the global set's cached, ungrouped allreduces of at most boardMaxBytes take it, and
//     only in a world on one host. The cache entry says that every rank matched the op's
//     signature before; an op is posted as its cache id and the Response that announced the id
//     (Cache.Born), which name one entry on every rank, though ids are reused after evictions.
//   - Its ops touch nothing the coordinator's collectives use (only the board), so the two paths
//     may interleave differently on different ranks.
//   - A rank arrives only with ops, and only when its set of ops changed or another rank waits
//     at the round, so mismatched ranks do not spin through empty rounds.
//   - An op that waited BoardWait without a match, an op whose entry this rank's cache evicted
//     before it was posted, and every op while some rank has joined, goes the coordinator's way: the rank withdraws its
//     arrival (possible until the round completes) and submits the ops to rank 0, where the stall
//     inspector and the mismatch errors see them. It counts them in the board's shared fallback
//     count until they complete, and while that count is above zero every rank sends its new ops
//     to rank 0 too and withdraws those it posted, so ranks that disagree meet there.

import (
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/kolo-dl/kolo/engine/negotiate"
	"github.com/kolo-dl/kolo/internal/spin"
	"github.com/kolo-dl/kolo/reduce"
	"github.com/kolo-dl/kolo/transport"
)

const (
	// boardMaxBytes is the largest allreduce that goes through the board: it takes the place of a
	// collective, so every rank reads every rank's copy of it.
	boardMaxBytes = 2 << 10
	// DefaultBoardWait is how long an op waits on the board for every rank before it goes the
	// coordinator's way: long enough for every rank of an oversubscribed host to have run (a
	// scheduler slice is a few milliseconds), short next to the stall inspector's warning.
	DefaultBoardWait = 50 * time.Millisecond

	// Block layout: a header (the round, the count of ops), a directory of (cache id, bytes,
	// born) by ascending id, then the data of those ops in that order.
	bhRound    = 0
	bhCount    = 8
	bhDir      = 64
	dirBytes   = 16
	boardOps   = 64
	boardData  = bhDir + dirBytes*boardOps
	boardSpace = transport.BoardBlockBytes - boardData
)

// board is a rank's part in the board's rounds (driver-owned).
type board struct {
	b       transport.Board
	n, rank int
	wait    time.Duration
	round   uint64   // the round this rank takes part in next, or is arrived at
	changed bool     // pending changed since this rank last arrived
	pending []*entry // by cache id (entry.boardID)
	inRound []*entry // the ops this rank posted in the round it is arrived at (none: not arrived)
	// evicted is the cache's eviction count when pending was last checked against it: while it
	// stays, every pending op's id still stands for it.
	evicted uint64
	// Scratch of boardRun: one op's data in every rank's block, and per rank the next entry of
	// its directory and where that entry's data starts.
	srcs           [][]byte
	cursor, offset []int
	reqs           []negotiate.Request
	// For tests: ops completed on the board, and ops sent to rank 0 after they came to it.
	ran, fellOps atomic.Int64
}

// newBoard returns the board of a world on one host, or nil where ops go rank 0's way alone.
func newBoard(cfg Config, g Group) *board {
	if g.Size < 2 || g.Local == nil || len(g.LocalRanks) != g.Size {
		return nil
	}
	for i, r := range g.LocalRanks {
		if r != i {
			return nil
		}
	}
	b, ok := g.Local.(transport.Board)
	if !ok {
		return nil
	}
	if cfg.CoordinatorOnly || cfg.CacheCapacity <= 0 {
		// Turned off here, so off for every rank: this rank holds a fallback for the job's life,
		// where ranks that kept it on would otherwise wait BoardWait for this one on every op.
		b.BoardFallbacks(1)
		return nil
	}
	wait := cfg.BoardWait
	if wait <= 0 {
		wait = DefaultBoardWait
	}
	return &board{b: b, n: g.Size, rank: g.Rank, wait: wait,
		srcs: make([][]byte, g.Size), cursor: make([]int, g.Size), offset: make([]int, g.Size)}
}

// boardable reports whether en may go through the board.
func (e *Engine) boardable(en *entry) (uint32, bool) {
	r := &en.req
	if e.brd == nil || en.set != e.global || e.joining != nil || r.Kind != negotiate.Allreduce ||
		r.ReduceOp == negotiate.ReduceAdasum || r.Group != 0 || r.Error != "" ||
		len(en.out) == 0 || len(en.out) > boardMaxBytes || strings.HasPrefix(r.Name, setChangePrefix) {
		return 0, false
	}
	id, ok := e.global.cache.Lookup(r)
	if !ok || e.brd.b.BoardFallbacks(0) > 0 {
		return 0, false
	}
	return id, true
}

// boardAdd takes en onto the board.
func (e *Engine) boardAdd(en *entry, id uint32) {
	b := e.brd
	en.boardID, en.boardBorn = id, e.global.cache.Born(id)
	i, _ := slices.BinarySearchFunc(b.pending, id, func(x *entry, id uint32) int { return int(x.boardID) - int(id) })
	b.pending = slices.Insert(b.pending, i, en)
	b.changed = true
}

// boardReady is the driver's wake-up condition for the board: the round this rank is arrived at
// completed, or another rank waits at the round this rank has ops for.
func (e *Engine) boardReady() bool {
	b := e.brd
	if b == nil || len(b.pending) == 0 {
		return false
	}
	got := b.b.BoardArrived(b.round)
	if len(b.inRound) > 0 {
		return got == b.n
	}
	return got > 0
}

// boardStep does the board's part of a step: execute a completed round, arrive at the next one,
// or send rank 0 what has waited too long. It reports whether anything happened, and false in ok
// when the loop must end.
func (e *Engine) boardStep(now time.Time) (progressed, ok bool) {
	b := e.brd
	if b == nil || len(b.pending) == 0 {
		return false, true
	}
	if len(b.inRound) > 0 {
		if b.b.BoardArrived(b.round) == b.n {
			return true, e.boardRun()
		}
		if b.b.BoardFallbacks(0) == 0 && !e.oldestWaited(now) {
			return false, true
		}
		if !b.b.BoardWithdraw(b.round) {
			return true, e.boardRun() // completed meanwhile
		}
		return true, e.boardFallBack(now)
	}
	if b.b.BoardFallbacks(0) > 0 || e.oldestWaited(now) {
		return true, e.boardFallBack(now)
	}
	if !b.changed && b.b.BoardArrived(b.round) == 0 {
		return false, true
	}
	return true, e.boardArrive(now)
}

// oldestWaited reports whether some op has waited on the board for BoardWait.
func (e *Engine) oldestWaited(now time.Time) bool { return !now.Before(e.boardDeadline()) }

// boardDeadline is when the op that came to the board first has waited BoardWait.
func (e *Engine) boardDeadline() time.Time {
	first := e.brd.pending[0].submitted
	for _, en := range e.brd.pending[1:] {
		if en.submitted.Before(first) {
			first = en.submitted
		}
	}
	return first.Add(e.brd.wait)
}

// boardArrive writes this rank's block for the current round and arrives at it. Ops whose cache
// entries this rank evicted meanwhile go to rank 0: the other ranks will not find them either.
func (e *Engine) boardArrive(now time.Time) bool {
	b := e.brd
	if cache := e.global.cache; cache.Evictions() != b.evicted {
		b.evicted = cache.Evictions()
		var gone []*entry
		b.pending = slices.DeleteFunc(b.pending, func(en *entry) bool {
			if id, ok := cache.Lookup(&en.req); !ok || id != en.boardID || cache.Born(id) != en.boardBorn {
				gone = append(gone, en)
				return true
			}
			return false
		})
		if len(gone) > 0 && !e.boardSubmit(now, gone) {
			return false
		}
	}
	if len(b.pending) == 0 {
		b.changed = false
		return true
	}
	blk := b.b.BoardBlock(b.rank, int(b.round&1))
	data := blk[boardData:]
	used, m := 0, 0
	b.inRound = b.inRound[:0]
	for _, en := range b.pending {
		sz := len(en.out)
		if m == boardOps || used+sz > boardSpace {
			break
		}
		d := blk[bhDir+dirBytes*m:]
		binary.LittleEndian.PutUint32(d, en.boardID)
		binary.LittleEndian.PutUint32(d[4:], uint32(sz))
		binary.LittleEndian.PutUint64(d[8:], en.boardBorn)
		src := en.in
		if len(src) == 0 {
			src = en.out
		}
		copy(data[used:used+sz], src)
		if f := preScale(boardResponse(&en.req)); f != 1 {
			reduce.Scale(en.req.DType, data[used:used+sz], f)
		}
		used += sz
		m++
		b.inRound = append(b.inRound, en)
	}
	binary.LittleEndian.PutUint64(blk[bhRound:], b.round)
	binary.LittleEndian.PutUint32(blk[bhCount:], uint32(m))
	b.changed = m < len(b.pending) // what did not fit goes in the next round
	if b.b.BoardArrive(b.round) {
		return e.boardRun()
	}
	return true
}

// boardRun executes the completed round: the ops every rank posted, in cache-id order.
func (e *Engine) boardRun() bool {
	b := e.brd
	k, p := b.round, int(b.round&1)
	for r := range b.n {
		blk := b.b.BoardBlock(r, p)
		if got := binary.LittleEndian.Uint64(blk[bhRound:]); got != k {
			e.fail(fmt.Errorf("rank %d: shared-memory negotiation: local rank %d's block is for round %d in round %d", e.g.Rank, r, got, k))
			return false
		}
	}
	// Every rank counts itself, spinning or not: the counts are cumulative per round parity, so
	// one round a rank skipped would leave every later round short of n, and ranks that linger
	// (boardLinger) would wait out their whole spin time after each.
	b.b.BoardSee(k)
	tl := e.tl.Load()
	cursor, offset := b.cursor, b.offset
	clear(cursor)
	clear(offset)
	done := 0
	for _, en := range b.inRound {
		id, sz := en.boardID, len(en.out)
		all := true
		for r := range b.n {
			blk := b.b.BoardBlock(r, p)
			cnt := int(binary.LittleEndian.Uint32(blk[bhCount:]))
			for cursor[r] < cnt {
				d := blk[bhDir+dirBytes*cursor[r]:]
				did, dsz := binary.LittleEndian.Uint32(d), int(binary.LittleEndian.Uint32(d[4:]))
				if did >= id {
					break
				}
				cursor[r]++
				offset[r] += dsz
			}
			if cursor[r] == cnt {
				all = false
				continue
			}
			d := blk[bhDir+dirBytes*cursor[r]:]
			if binary.LittleEndian.Uint32(d) != id || binary.LittleEndian.Uint64(d[8:]) != en.boardBorn {
				all = false // not posted there, or posted for another entry of the id
				continue
			}
			if dsz := int(binary.LittleEndian.Uint32(d[4:])); dsz != sz {
				e.fail(fmt.Errorf("rank %d: shared-memory negotiation: allreduce %q (cache id %d) is %d bytes here and %d on local rank %d", e.g.Rank, en.req.Name, id, sz, dsz, r))
				return false
			}
			b.srcs[r] = blk[boardData+offset[r] : boardData+offset[r]+sz]
		}
		if !all {
			continue
		}
		reduce.Many(en.req.DType, reduce.Op(en.req.ReduceOp), en.out, b.srcs...)
		if f := postScale(boardResponse(&en.req), b.n); f != 1 {
			reduce.Scale(en.req.DType, en.out, f)
		}
		if tl != nil {
			names := []string{en.req.Name}
			tl.Negotiated(0, names, opLabel(en.req.Kind))
			tl.Done(0, names)
		}
		en.boardID = doneBoardID
		done++
		b.ran.Add(1)
	}
	if done > 0 {
		e.boardLinger(k)
	}
	for _, en := range b.inRound {
		if en.boardID == doneBoardID {
			en.h.finish(nil)
		}
	}
	clear(b.srcs)
	clear(b.inRound)
	b.inRound = b.inRound[:0]
	if done > 0 {
		b.pending = slices.DeleteFunc(b.pending, func(en *entry) bool { return en.boardID == doneBoardID })
		b.changed = true // what is left may now match ops other ranks had posted
	}
	b.round++
	return true
}

// boardLinger waits, where ranks spin (each has a CPU), up to the spin time for every rank to have
// read round k before this rank returns its ops. Through the coordinator, the collective after the
// response keeps the ranks' returns together; on the board the rank that completes a round would
// otherwise return while a peer that had gone to sleep is still being woken, some tens of
// microseconds later: enough for a program that times one rank's next op from its own previous
// one (Horovod's barrier tests) to see a skew that a collective never showed.
func (e *Engine) boardLinger(k uint64) {
	b := e.brd
	if b.b.BoardSeen(k) == b.n {
		return
	}
	d := e.spinTime()
	if d <= 0 {
		// Ranks outnumber cores: a trial build that lingered by yielding took 166-185 us per
		// 4-byte op at 32 ranks (`kolo bench`, two runs) where the runs just before without it
		// took 116-139, and such a host shows skews of a scheduler slice anyway.
		return
	}
	start := time.Now()
	for i := 1; b.b.BoardSeen(k) < b.n; i++ {
		if i%64 == 0 && time.Since(start) > d {
			return
		}
		spin.Pause()
	}
}

// doneBoardID marks an entry boardRun completed.
const doneBoardID = ^uint32(0)

// boardFallBack sends every op on the board to rank 0, counting them in the shared fallback count
// until they complete.
func (e *Engine) boardFallBack(now time.Time) bool {
	b := e.brd
	ens := b.pending
	b.pending = nil
	b.changed = false
	clear(b.inRound)
	b.inRound = b.inRound[:0]
	for _, en := range ens {
		en.h.fellBack = b.b
	}
	b.b.BoardFallbacks(int64(len(ens)))
	b.fellOps.Add(int64(len(ens)))
	return e.boardSubmit(now, ens)
}

// boardSubmit hands ops taken off the board to the coordinator, as drainQueue does with new ones.
func (e *Engine) boardSubmit(now time.Time, ens []*entry) bool {
	b := e.brd
	ps := e.global
	b.reqs = b.reqs[:0]
	for _, en := range ens {
		ps.pending[en.req.Name] = en
		e.inflight++
		b.reqs = append(b.reqs, en.req)
	}
	bt := e.newBatch(ps.id, false)
	ps.cache.Compact(bt, b.reqs...)
	clear(b.reqs)
	return e.submit(now, bt)
}

// boardFlush takes this rank off the board before it joins: what its round matched runs, the rest
// goes to rank 0 ahead of the join.
func (e *Engine) boardFlush(now time.Time) bool {
	b := e.brd
	if b == nil || len(b.pending) == 0 {
		return true
	}
	if len(b.inRound) > 0 && !b.b.BoardWithdraw(b.round) {
		if !e.boardRun() {
			return false
		}
	}
	if len(b.pending) == 0 {
		return true
	}
	return e.boardFallBack(now)
}

// boardResponse is what a board op's scaling reads of the Response the coordinator would have sent
// for its request: the board runs cached ops without one.
func boardResponse(q *negotiate.Request) negotiate.Response {
	return negotiate.Response{DType: q.DType, GPU: q.GPU, PreScale: q.PreScale, PostScale: q.PostScale,
		Average: q.Average}
}
