package shm

import (
	"sync/atomic"

	"github.com/kolo-dl/kolo/transport"
)

// BoardBlockBytes is the size of the board's blocks in the segment (transport.Board).
const BoardBlockBytes = transport.BoardBlockBytes

// The board's rounds count arrivals in two counters, one per parity, that only grow except for
// withdrawals: round k has parity k&1 and completes when its counter reaches size*(k/2+1). No rank
// arrives at round k+2 before round k+1 completed, and no rank arrives at k+1 before k completed, so
// while round k is open its counter holds exactly the arrivals at k beyond the earlier rounds'.

var (
	_ transport.Board   = (*comm)(nil)
	_ transport.Spinner = (*comm)(nil)
)

func (c *comm) BoardBlock(r, p int) []byte {
	off := c.g.lay.board(r, p&1)
	return c.g.mem[off : off+BoardBlockBytes : off+BoardBlockBytes]
}

// roundCounter is round k's counter of the pair at off (one per parity, on lines of their own),
// and the value it reaches once every rank counted in round k.
func (c *comm) roundCounter(off int64, k uint64) (*uint64, uint64) {
	return c.g.u64(off + cacheLine*int64(k&1)), uint64(c.g.size) * (k/2 + 1)
}

func (c *comm) boardCount(k uint64) (*uint64, uint64) { return c.roundCounter(offBoardArrived, k) }

func (c *comm) BoardArrive(k uint64) bool {
	cnt, target := c.boardCount(k)
	v := atomic.AddUint64(cnt, 1)
	if v != target && v != target-uint64(c.g.size)+1 {
		return false
	}
	// A rank waiting for the round to complete, or with something to post once another rank
	// arrives, may sleep on its messenger's doorbell (the engine's driver does): ring every one,
	// which costs a load where nobody sleeps.
	for r := range c.g.size {
		c.g.bell(r, rMsgBell).ring()
	}
	return v == target
}

func (c *comm) BoardWithdraw(k uint64) bool {
	cnt, target := c.boardCount(k)
	for {
		v := atomic.LoadUint64(cnt)
		if v >= target {
			return false
		}
		if atomic.CompareAndSwapUint64(cnt, v, v-1) {
			return true
		}
	}
}

func (c *comm) BoardArrived(k uint64) int { return c.inRound(c.boardCount(k)) }

// inRound is how many of the counts in cnt belong to the round whose last one is target: the
// counters only grow (but for withdrawals), by one per rank and round of their parity.
func (c *comm) inRound(cnt *uint64, target uint64) int {
	v := atomic.LoadUint64(cnt)
	base := target - uint64(c.g.size)
	if v <= base {
		return 0
	}
	return int(min(v, target) - base)
}

func (c *comm) BoardFallbacks(delta int64) int64 {
	if delta == 0 {
		return int64(atomic.LoadUint64(c.g.u64(offBoardFalls))) // the driver's, while the segment is mapped
	}
	// A change may come from an op's completion at any time, also after the segment was released
	// (an engine stopping after its world closed): then there is no count left to keep.
	c.g.mu.RLock()
	defer c.g.mu.RUnlock()
	if c.g.released {
		return 0
	}
	return int64(atomic.AddUint64(c.g.u64(offBoardFalls), uint64(delta))) // two's complement: a negative delta subtracts
}

func (c *comm) seenCount(k uint64) (*uint64, uint64) { return c.roundCounter(offBoardSeen, k) }

func (c *comm) BoardSee(k uint64) {
	cnt, _ := c.seenCount(k)
	atomic.AddUint64(cnt, 1)
}

func (c *comm) BoardSeen(k uint64) int { return c.inRound(c.seenCount(k)) }
