package transport

import (
	"context"
	"fmt"
	"sync/atomic"
)

// Sub returns a view of c as a smaller group: sub-rank i is rank members[i] of c, and c.Rank() must
// be one of the members. Hierarchical algorithms use it to name "the ranks of my host" and "the
// ranks with my local rank on other hosts" without new connections.
//
// The view claims Shared (forwarding Slot and Barrier, renumbered) only when c implements Shared and
// members are all of c's ranks: a Shared barrier waits for the whole segment, so a strict sub-group
// must take message-passing paths.
//
// Errors from c pass through wrapped, keeping any *PeerError: its Rank stays the rank in c (the
// process that failed has one identity in logs), while the wrapping message gives the sub-rank too.
// Close ends the view (later calls return ErrClosed) but not c, which may back other views; it
// does not interrupt calls in progress on c.
func Sub(c Comm, members []int) (Comm, error) {
	n := c.Size()
	if len(members) == 0 {
		return nil, fmt.Errorf("sub-group of rank %d: no members", c.Rank())
	}
	seen := make(map[int]bool, len(members))
	self := -1
	for i, m := range members {
		if m < 0 || m >= n {
			return nil, fmt.Errorf("sub-group of rank %d: member %d is rank %d, outside [0,%d)", c.Rank(), i, m, n)
		}
		if seen[m] {
			return nil, fmt.Errorf("sub-group of rank %d: rank %d listed twice", c.Rank(), m)
		}
		seen[m] = true
		if m == c.Rank() {
			self = i
		}
	}
	if self < 0 {
		return nil, fmt.Errorf("sub-group %v does not contain this rank (%d)", members, c.Rank())
	}
	v := &subComm{parent: c, members: append([]int(nil), members...), rank: self}
	if s, ok := c.(Shared); ok && len(members) == n {
		return &subShared{subComm: v, shared: s}, nil
	}
	return v, nil
}

type subComm struct {
	parent  Comm
	members []int
	rank    int
	closed  atomic.Bool
}

func (v *subComm) Rank() int { return v.rank }
func (v *subComm) Size() int { return len(v.members) }

// peer maps a sub-rank to c's rank, or says why it cannot.
func (v *subComm) peer(p int, op string) (int, error) {
	if v.closed.Load() {
		return 0, fmt.Errorf("sub-group rank %d: %s sub-rank %d: %w", v.rank, op, p, ErrClosed)
	}
	if p < 0 || p >= len(v.members) {
		return 0, fmt.Errorf("sub-group rank %d: %s sub-rank %d: outside [0,%d)", v.rank, op, p, len(v.members))
	}
	return v.members[p], nil
}

func (v *subComm) wrap(err error, op string, p int) error {
	return fmt.Errorf("sub-group rank %d: %s sub-rank %d (rank %d): %w", v.rank, op, p, v.members[p], err)
}

func (v *subComm) Send(ctx context.Context, peer int, b []byte) error {
	p, err := v.peer(peer, "send to")
	if err != nil {
		return err
	}
	if err := v.parent.Send(ctx, p, b); err != nil {
		return v.wrap(err, "send to", peer)
	}
	return nil
}

func (v *subComm) Recv(ctx context.Context, peer int, b []byte) error {
	p, err := v.peer(peer, "recv from")
	if err != nil {
		return err
	}
	if err := v.parent.Recv(ctx, p, b); err != nil {
		return v.wrap(err, "recv from", peer)
	}
	return nil
}

func (v *subComm) SendRecv(ctx context.Context, to int, sb []byte, from int, rb []byte) error {
	pt, err := v.peer(to, "send to")
	if err != nil {
		return err
	}
	pf, err := v.peer(from, "recv from")
	if err != nil {
		return err
	}
	if err := v.parent.SendRecv(ctx, pt, sb, pf, rb); err != nil {
		return fmt.Errorf("sub-group rank %d: send to sub-rank %d (rank %d), recv from sub-rank %d (rank %d): %w",
			v.rank, to, pt, from, pf, err)
	}
	return nil
}

func (v *subComm) Close() error {
	v.closed.Store(true)
	return nil
}

// subShared is a view of all of a Shared group, possibly renumbered.
type subShared struct {
	*subComm
	shared Shared
}

func (v *subShared) Slot(r int) []byte { return v.shared.Slot(v.members[r]) }

func (v *subShared) Oversubscribed() bool { return v.shared.Oversubscribed() }

func (v *subShared) Memo() *atomic.Uint32 { return v.shared.Memo() }

func (v *subShared) Barrier(ctx context.Context) error {
	if v.closed.Load() {
		return fmt.Errorf("sub-group rank %d: barrier: %w", v.rank, ErrClosed)
	}
	if err := v.shared.Barrier(ctx); err != nil {
		return fmt.Errorf("sub-group rank %d: barrier: %w", v.rank, err)
	}
	return nil
}
