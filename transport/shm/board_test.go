package shm

import (
	"encoding/binary"
	"sync"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/transport"
)

func boardOf(t *testing.T, g *Group) transport.Board {
	t.Helper()
	b, ok := g.Comm().(transport.Board)
	if !ok {
		t.Fatal("the shm Comm is not a transport.Board")
	}
	return b
}

// Rounds complete only with every rank arrived at once: ranks that withdraw and arrive again at
// random never let a round complete without them, a completed round cannot be withdrawn from, and
// each round's blocks hold what their owners wrote for it when every rank reads them, though the
// blocks of round k+2 reuse them.
func TestBoardRounds(t *testing.T) {
	const n, rounds = 4, 300
	gs := openAll(t, testConfig(t, n))
	var wg sync.WaitGroup
	errs := make(chan string, n)
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b := boardOf(t, gs[r])
			deadline := time.Now().Add(30 * time.Second)
			for k := uint64(0); k < rounds; k++ {
				blk := b.BoardBlock(r, int(k&1))
				binary.LittleEndian.PutUint64(blk, k*100+uint64(r))
				done := b.BoardArrive(k)
				// Ranks 1 and 3 change their mind every third round: withdraw, rewrite, arrive again.
				if !done && r%2 == 1 && k%3 == 0 {
					if b.BoardWithdraw(k) {
						if got := b.BoardArrived(k); got >= n {
							errs <- "a withdrawal left the round complete"
							return
						}
						binary.LittleEndian.PutUint64(blk[8:], k)
						done = b.BoardArrive(k)
					}
				}
				for !done && b.BoardArrived(k) < n {
					if time.Now().After(deadline) {
						errs <- "a round did not complete"
						return
					}
					time.Sleep(time.Microsecond)
				}
				if b.BoardWithdraw(k) {
					errs <- "withdrew from a completed round"
					return
				}
				for q := range n {
					if v := binary.LittleEndian.Uint64(b.BoardBlock(q, int(k&1))); v != k*100+uint64(q) {
						errs <- "a block did not hold its round's value"
						return
					}
				}
				if got := b.BoardSeen(k); got >= n {
					errs <- "a round was seen by every rank before this one saw it"
					return
				}
				b.BoardSee(k)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	b := boardOf(t, gs[0])
	for k := uint64(rounds - 2); k < rounds; k++ {
		if got := b.BoardSeen(k); got != n {
			t.Errorf("round %d was seen by %d ranks, want %d", k, got, n)
		}
	}
	if got := b.BoardFallbacks(2); got != 2 {
		t.Errorf("fallbacks after adding 2: %d", got)
	}
	if got := boardOf(t, gs[3]).BoardFallbacks(-2); got != 0 {
		t.Errorf("fallbacks after adding 2 and -2 on another rank: %d", got)
	}
}

// An op that completes after its rank's segment was released (its engine stopping late) changes
// the fallback count without touching the unmapped memory.
func TestBoardFallbacksAfterClose(t *testing.T) {
	gs := openAll(t, testConfig(t, 2))
	b := boardOf(t, gs[0])
	b.BoardFallbacks(1)
	for _, g := range gs {
		g.Close()
	}
	if got := b.BoardFallbacks(-1); got != 0 {
		t.Errorf("a change after close returned %d, want 0", got)
	}
}
