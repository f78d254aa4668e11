package transport_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/transport"
	"github.com/kolo-dl/kolo/internal/transport/inmem"
)

func TestSubRejectsBadMembers(t *testing.T) {
	eps := inmem.New(4)
	defer func() {
		for _, e := range eps {
			e.Close()
		}
	}()
	for _, tc := range []struct {
		name    string
		members []int
		want    string
	}{
		{"empty", nil, "no members"},
		{"out of range", []int{1, 4}, "outside"},
		{"negative", []int{-1, 1}, "outside"},
		{"duplicate", []int{1, 2, 1}, "twice"},
		{"without self", []int{0, 2}, "does not contain"},
	} {
		if _, err := transport.Sub(eps[1], tc.members); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Sub(%v) = %v, want an error containing %q", tc.name, tc.members, err, tc.want)
		}
	}
}

// Two disjoint sub-groups of one group exchange bytes at the same time, each in its own numbering.
func TestSubRenumbersRanks(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	eps := inmem.New(4)
	groups := [][]int{{3, 1}, {0, 2}}
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for _, members := range groups {
		for i, r := range members {
			wg.Go(func() {
				v, err := transport.Sub(eps[r], members)
				if err != nil {
					errs[r] = err
					return
				}
				if v.Rank() != i || v.Size() != 2 {
					t.Errorf("rank %d in %v: view says rank %d of %d", r, members, v.Rank(), v.Size())
				}
				got := make([]byte, 1)
				if err := v.SendRecv(ctx, 1-i, []byte{byte(r)}, 1-i, got); err != nil {
					errs[r] = err
					return
				}
				if int(got[0]) != members[1-i] {
					t.Errorf("rank %d in %v: got a byte from rank %d, want %d", r, members, got[0], members[1-i])
				}
			})
		}
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}

func TestSubClaimsSharedOnlyForTheWholeGroup(t *testing.T) {
	eps := inmem.New(3, inmem.WithSlotBytes(8))
	whole, err := transport.Sub(eps[0], []int{2, 0, 1})
	if err != nil {
		t.Fatal(err)
	}
	s, ok := whole.(transport.Shared)
	if !ok {
		t.Fatal("a view of the whole Shared group does not claim Shared")
	}
	eps[2].Slot(2)[0] = 42
	if got := s.Slot(0)[0]; got != 42 {
		t.Errorf("sub-rank 0 (rank 2) slot reads %d, want 42", got)
	}
	if &s.Slot(1)[0] != &eps[0].Slot(0)[0] {
		t.Error("sub-rank 1's slot is not rank 0's slot")
	}
	part, err := transport.Sub(eps[0], []int{0, 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := part.(transport.Shared); ok {
		t.Error("a strict sub-group claims Shared")
	}
	plain, err := transport.Sub(inmem.New(2, inmem.WithoutShared())[0].Comm(), []int{0, 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := plain.(transport.Shared); ok {
		t.Error("a view of a non-Shared group claims Shared")
	}

	// The forwarded barrier is the group's barrier.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for r := 1; r < 3; r++ {
		wg.Go(func() {
			if err := eps[r].Barrier(ctx); err != nil {
				t.Errorf("rank %d barrier: %v", r, err)
			}
		})
	}
	if err := s.Barrier(ctx); err != nil {
		t.Errorf("view barrier: %v", err)
	}
	wg.Wait()
}

func TestSubKeepsParentRankInPeerError(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	eps := inmem.New(4)
	v, err := transport.Sub(eps[1], []int{1, 3})
	if err != nil {
		t.Fatal(err)
	}
	eps[3].Kill(errors.New("host down"))
	err = v.Recv(ctx, 1, make([]byte, 4))
	var pe *transport.PeerError
	if !errors.As(err, &pe) || !errors.Is(err, transport.ErrPeerLost) {
		t.Fatalf("got %v, want a *PeerError", err)
	}
	if pe.Rank != 3 {
		t.Errorf("PeerError names rank %d, want the parent's rank 3", pe.Rank)
	}
	if !strings.Contains(err.Error(), "sub-rank 1") {
		t.Errorf("error %q does not name the sub-rank", err)
	}
}

func TestSubCloseLeavesParentOpen(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	eps := inmem.New(2)
	v, err := transport.Sub(eps[0], []int{0, 1})
	if err != nil {
		t.Fatal(err)
	}
	v.Close()
	if err := v.Send(ctx, 1, []byte{1}); !errors.Is(err, transport.ErrClosed) {
		t.Errorf("send on a closed view: %v", err)
	}
	if err := v.(transport.Shared).Barrier(ctx); !errors.Is(err, transport.ErrClosed) {
		t.Errorf("barrier on a closed view: %v", err)
	}
	if err := eps[0].Send(ctx, 1, []byte{9}); err != nil {
		t.Fatalf("parent after closing the view: %v", err)
	}
	got := []byte{0}
	if err := eps[1].Recv(ctx, 0, got); err != nil || !bytes.Equal(got, []byte{9}) {
		t.Fatalf("parent recv: %v %v", got, err)
	}
}
