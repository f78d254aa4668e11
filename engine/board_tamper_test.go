//go:build linux

package engine

import (
	"encoding/binary"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/transport"
)

// sharedBoard is what the shm Comm is to the engine: a Comm that shares memory and has a board.
type sharedBoard interface {
	transport.Comm
	transport.Shared
	transport.Board
}

// tamperedBoard shows its rank a corrupted copy of local rank 0's blocks once armed: the round
// number wrong ("round") or the size of the first op in its directory ("size"). Nothing a healthy
// segment shows, but what a rank would see of a peer that wrote garbage or ran another kolo.
type tamperedBoard struct {
	sharedBoard
	mode  string
	armed atomic.Bool
}

func (b *tamperedBoard) BoardBlock(r, p int) []byte {
	blk := b.sharedBoard.BoardBlock(r, p)
	if r != 0 || !b.armed.Load() {
		return blk
	}
	c := append([]byte(nil), blk...)
	switch b.mode {
	case "round":
		binary.LittleEndian.PutUint64(c[bhRound:], binary.LittleEndian.Uint64(c[bhRound:])+2)
	case "size":
		if binary.LittleEndian.Uint32(c[bhCount:]) > 0 {
			binary.LittleEndian.PutUint32(c[bhDir+4:], binary.LittleEndian.Uint32(c[bhDir+4:])+4)
		}
	}
	return c
}

// A rank that finds the board corrupt fails its op with what it found, and every other rank fails
// too, naming that rank, within a bounded time: the board's checks of a block's round and of an
// op's size are the last word before a rank would reduce garbage into a user's tensor.
func TestBoardCorruptionFailsEveryRank(t *testing.T) {
	for _, tc := range []struct{ mode, want string }{
		{"round", "local rank 0's block is for round"},
		{"size", "on local rank 0"},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			const n = 3
			captureLog(t)
			var tb *tamperedBoard
			c := boardClusterEach(t, n, time.Second, func(r int, g *Group) {
				if r == 1 {
					tb = &tamperedBoard{sharedBoard: g.Local.(sharedBoard), mode: tc.mode}
					g.Local = tb
				}
			}, nil)
			ctx := waitCtx(t)
			step := func(name string) []error {
				errs := make([]error, n)
				onEachRank(n, func(r int) {
					buf := f32(float32(r + 1))
					if errs[r] = c.engines[r].Enqueue(allreduceReq(name, 1), buf, buf).Wait(ctx); errs[r] == nil && getF32(buf)[0] != 6 {
						errs[r] = fmt.Errorf("sum %v, want 6", getF32(buf)[0])
					}
				})
				return errs
			}
			for i := range 5 { // the first through rank 0, then cached: the board's
				for r, err := range step("x") {
					if err != nil {
						t.Fatalf("warm-up op %d, rank %d: %v", i, r, err)
					}
				}
			}
			if ran, _ := boardRan(c); ran == 0 {
				t.Fatal("no op ran on the board")
			}
			tb.armed.Store(true)
			errs := step("x")
			if errs[1] == nil || !strings.Contains(errs[1].Error(), tc.want) {
				t.Fatalf("rank 1, which sees the corruption: %v, want an error with %q", errs[1], tc.want)
			}
			// The others may have finished the op (their view was sound); their next one fails,
			// naming rank 1.
			for r := range n {
				if r == 1 {
					continue
				}
				err := errs[r]
				if err == nil {
					buf := f32(1)
					err = c.engines[r].Enqueue(allreduceReq("y", 1), buf, buf).Wait(ctx)
				}
				if err == nil || !strings.Contains(err.Error(), "rank 1") {
					t.Errorf("rank %d: %v, want an error naming rank 1", r, err)
				}
				if r == 0 {
					t.Logf("rank 1: %v\nrank 0: %v", errs[1], err)
				}
			}
		})
	}
}
