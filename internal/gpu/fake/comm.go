package fake

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/kolo-dl/kolo/internal/gpu"
)

// Library forms fake communicators among ranks of one process (goroutines, one Device each).
type Library struct {
	mu      sync.Mutex
	cliques map[gpu.UniqueID]*clique
}

var _ gpu.Library = (*Library)(nil)

// NewLibrary returns a Library; ranks that are to meet must share it.
func NewLibrary() *Library { return &Library{cliques: map[gpu.UniqueID]*clique{}} }

// NewUniqueID implements gpu.Library.
func (l *Library) NewUniqueID() (gpu.UniqueID, error) {
	var id gpu.UniqueID
	_, _ = rand.Read(id[:]) // crypto/rand.Read never fails
	return id, nil
}

// clique is the ranks of one communicator: where their collectives meet.
type clique struct {
	size     int
	mu       sync.Mutex
	joined   int
	formed   chan struct{}
	meetings map[uint64]*meeting
	votes    map[uint64]*ballot // splits in progress, by split number
}

// NewComm implements gpu.Library: it blocks until size ranks joined id, as ncclCommInitRank
// does.
func (l *Library) NewComm(ctx context.Context, dev gpu.Device, id gpu.UniqueID, size, rank int) (gpu.Comm, error) {
	d, ok := dev.(*Device)
	if !ok {
		return nil, fmt.Errorf("fake comm on a %T", dev)
	}
	if rank < 0 || rank >= size {
		return nil, fmt.Errorf("fake comm: rank %d of %d", rank, size)
	}
	l.mu.Lock()
	c := l.cliques[id]
	if c == nil {
		c = &clique{size: size, formed: make(chan struct{}), meetings: map[uint64]*meeting{}}
		l.cliques[id] = c
	}
	l.mu.Unlock()
	return join(ctx, c, d, size, rank)
}

func join(ctx context.Context, c *clique, d *Device, size, rank int) (*Comm, error) {
	c.mu.Lock()
	if c.size != size {
		c.mu.Unlock()
		return nil, fmt.Errorf("fake comm: rank %d joins with size %d, others with %d", rank, size, c.size)
	}
	c.joined++
	if c.joined == c.size {
		close(c.formed)
	}
	c.mu.Unlock()
	select {
	case <-c.formed:
	case <-ctx.Done():
		return nil, fmt.Errorf("fake comm rank %d of %d: not every rank joined: %w", rank, size, ctx.Err())
	}
	return &Comm{clique: c, dev: d, rank: rank, aborted: make(chan struct{})}, nil
}

// Comm is one rank's end of a fake communicator.
type Comm struct {
	clique *clique
	dev    *Device
	rank   int

	seq      uint64 // operations enqueued: NCCL matches collectives by call order
	group    []op   // operations since GroupStart
	inGroup  int
	groupStr *Stream

	mu      sync.Mutex
	lost    bool
	failed  error
	aborted chan struct{}
	splits  uint64
}

var _ gpu.Comm = (*Comm)(nil)
var _ gpu.Splitter = (*Comm)(nil)

// Rank implements gpu.Comm.
func (c *Comm) Rank() int { return c.rank }

// Size implements gpu.Comm.
func (c *Comm) Size() int { return c.clique.size }

type opKind uint8

const (
	opAllReduce opKind = iota
	opBroadcast
	opAllGather
	opReduceScatter
	opSend
	opRecv
)

var opNames = [...]string{"allreduce", "broadcast", "allgather", "reducescatter", "send", "recv"}

type op struct {
	kind       opKind
	count      int // elements sent (recv for reducescatter)
	t          gpu.DataType
	red        gpu.RedOp
	peer       int // root or peer
	send, recv []byte
}

func (o op) String() string {
	return fmt.Sprintf("%s of %d %s (op %s, root/peer %d)", opNames[o.kind], o.count, o.t, o.red, o.peer)
}

// AllReduce implements gpu.Comm.
func (c *Comm) AllReduce(send, recv gpu.Ptr, count int, t gpu.DataType, red gpu.RedOp, s gpu.Stream) error {
	return c.post(s, opAllReduce, count, t, red, 0, send, count, recv, count)
}

// Broadcast implements gpu.Comm.
func (c *Comm) Broadcast(send, recv gpu.Ptr, count int, t gpu.DataType, root int, s gpu.Stream) error {
	if root < 0 || root >= c.Size() {
		return fmt.Errorf("fake broadcast: root %d of %d ranks", root, c.Size())
	}
	sendCount := 0
	if c.rank == root {
		sendCount = count
	}
	return c.post(s, opBroadcast, count, t, 0, root, send, sendCount, recv, count)
}

// AllGather implements gpu.Comm.
func (c *Comm) AllGather(send, recv gpu.Ptr, sendCount int, t gpu.DataType, s gpu.Stream) error {
	return c.post(s, opAllGather, sendCount, t, 0, 0, send, sendCount, recv, sendCount*c.Size())
}

// ReduceScatter implements gpu.Comm.
func (c *Comm) ReduceScatter(send, recv gpu.Ptr, recvCount int, t gpu.DataType, red gpu.RedOp, s gpu.Stream) error {
	return c.post(s, opReduceScatter, recvCount, t, red, 0, send, recvCount*c.Size(), recv, recvCount)
}

// Send implements gpu.Comm. The fake supports point-to-point only inside a group that every rank
// of the communicator enters (the shape of AllToAll), since it matches work by call order.
func (c *Comm) Send(buf gpu.Ptr, count int, t gpu.DataType, peer int, s gpu.Stream) error {
	return c.p2p(s, opSend, buf, count, t, peer)
}

// Recv implements gpu.Comm, with Send's restriction.
func (c *Comm) Recv(buf gpu.Ptr, count int, t gpu.DataType, peer int, s gpu.Stream) error {
	return c.p2p(s, opRecv, buf, count, t, peer)
}

func (c *Comm) p2p(s gpu.Stream, kind opKind, buf gpu.Ptr, count int, t gpu.DataType, peer int) error {
	if c.inGroup == 0 {
		return fmt.Errorf("fake %s: only inside GroupStart/GroupEnd", opNames[kind])
	}
	if peer < 0 || peer >= c.Size() {
		return fmt.Errorf("fake %s: peer %d of %d ranks", opNames[kind], peer, c.Size())
	}
	if kind == opSend {
		return c.post(s, kind, count, t, 0, peer, buf, count, 0, 0)
	}
	return c.post(s, kind, count, t, 0, peer, 0, 0, buf, count)
}

// post checks the buffers (as NCCL checks its arguments at enqueue) and adds the operation to the
// open group, or enqueues it alone.
func (c *Comm) post(s gpu.Stream, kind opKind, count int, t gpu.DataType, red gpu.RedOp, peer int, send gpu.Ptr, sendCount int, recv gpu.Ptr, recvCount int) error {
	if err := c.usable(); err != nil {
		return err
	}
	st, err := c.stream(s)
	if err != nil {
		return err
	}
	if t.Size() == 0 || count < 0 {
		return fmt.Errorf("fake %s: %d elements of %s", opNames[kind], count, t)
	}
	if (kind == opAllReduce || kind == opReduceScatter) && (red < gpu.Sum || red > gpu.Avg) {
		return fmt.Errorf("fake %s: reduction %s", opNames[kind], red)
	}
	o := op{kind: kind, count: count, t: t, red: red, peer: peer}
	if sendCount > 0 {
		if o.send, err = c.dev.Bytes(send, sendCount*t.Size()); err != nil {
			return fmt.Errorf("fake %s send buffer: %w", opNames[kind], err)
		}
	}
	if recvCount > 0 {
		if o.recv, err = c.dev.Bytes(recv, recvCount*t.Size()); err != nil {
			return fmt.Errorf("fake %s recv buffer: %w", opNames[kind], err)
		}
	}
	if c.inGroup > 0 {
		if c.groupStr != nil && c.groupStr != st {
			return fmt.Errorf("fake %s: a group on two streams", opNames[kind])
		}
		c.groupStr = st
		c.group = append(c.group, o)
		return nil
	}
	return c.launch(st, []op{o})
}

func (c *Comm) stream(s gpu.Stream) (*Stream, error) {
	switch st := s.(type) {
	case *Stream:
		return st, nil
	case *borrowed:
		return st.Stream, nil
	}
	return nil, fmt.Errorf("fake comm on a %T stream", s)
}

func (c *Comm) usable() error {
	select {
	case <-c.aborted:
		return fmt.Errorf("fake comm rank %d: %w", c.rank, gpu.ErrAborted)
	default:
		return nil
	}
}

// GroupStart implements gpu.Comm; groups nest, as NCCL's do.
func (c *Comm) GroupStart() error {
	c.inGroup++
	return nil
}

// GroupEnd implements gpu.Comm: the outermost one launches the group's operations as one unit.
func (c *Comm) GroupEnd() error {
	if c.inGroup == 0 {
		return errors.New("fake GroupEnd without GroupStart")
	}
	c.inGroup--
	if c.inGroup > 0 {
		return nil
	}
	ops, st := c.group, c.groupStr
	c.group, c.groupStr = nil, nil
	if len(ops) == 0 {
		return nil
	}
	if err := c.usable(); err != nil {
		return err
	}
	return c.launch(st, ops)
}

// launch enqueues ops as the communicator's next unit of work: on the stream, it waits until every
// rank reached its unit of the same number (a lost rank never does), or this rank aborts.
func (c *Comm) launch(st *Stream, ops []op) error {
	c.seq++
	seq := c.seq
	return st.enqueue(func() {
		if c.usable() != nil {
			return // aborted before it started: it never reaches the peers
		}
		c.mu.Lock()
		lost := c.lost
		c.mu.Unlock()
		if lost {
			<-c.aborted // a dead process's kernels run no more; only abort frees its stream
			return
		}
		m := c.clique.arrive(seq, c.rank, ops)
		select {
		case <-m.done:
			if m.err != nil {
				c.fail(m.err)
			}
		case <-c.aborted:
		}
	})
}

// meeting is one unit of work of every rank.
type meeting struct {
	parts   [][]op
	arrived int
	done    chan struct{}
	err     error
}

func (k *clique) arrive(seq uint64, rank int, ops []op) *meeting {
	k.mu.Lock()
	m := k.meetings[seq]
	if m == nil {
		m = &meeting{parts: make([][]op, k.size), done: make(chan struct{})}
		k.meetings[seq] = m
	}
	m.parts[rank] = ops
	m.arrived++
	last := m.arrived == k.size
	if last {
		delete(k.meetings, seq)
	}
	k.mu.Unlock()
	if last {
		// Every other rank's stream is blocked on m.done, so their buffers are ours to write.
		m.err = execute(m.parts)
		close(m.done)
	}
	return m
}

func (c *Comm) fail(err error) {
	c.mu.Lock()
	if c.failed == nil {
		c.failed = err
	}
	c.mu.Unlock()
}

// AsyncError implements gpu.Comm.
func (c *Comm) AsyncError() error {
	if err := c.usable(); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.failed != nil {
		return fmt.Errorf("fake comm rank %d: %w", c.rank, c.failed)
	}
	return nil
}

// Abort implements gpu.Comm.
func (c *Comm) Abort() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	select {
	case <-c.aborted:
	default:
		close(c.aborted)
	}
	return nil
}

// Destroy implements gpu.Comm.
func (c *Comm) Destroy() error {
	if err := c.usable(); err != nil {
		return err
	}
	return c.Abort()
}

// Lose makes this rank behave as a process that died: the work it enqueued from now on (and any
// not yet started) never reaches its peers, which stay blocked in that collective until they
// abort, as NCCL's do.
func (c *Comm) Lose() {
	c.mu.Lock()
	c.lost = true
	c.mu.Unlock()
}

// Split implements gpu.Splitter. Like ncclCommSplit it is collective over the parent: every rank
// calls it, in the same order relative to its other splits.
func (c *Comm) Split(ctx context.Context, color, key int) (gpu.Comm, error) {
	if err := c.usable(); err != nil {
		return nil, err
	}
	c.splits++
	k := c.clique
	// The members of each color are known only when every rank has said its color: gather them
	// on the parent's meeting point for this split, then form one clique per color.
	k.mu.Lock()
	if k.votes == nil {
		k.votes = map[uint64]*ballot{}
	}
	b := k.votes[c.splits]
	if b == nil {
		b = &ballot{colors: make([][2]int, k.size), done: make(chan struct{})}
		k.votes[c.splits] = b
	}
	b.colors[c.rank] = [2]int{color, key}
	b.n++
	if b.n == k.size {
		delete(k.votes, c.splits)
		b.form()
		close(b.done)
	}
	k.mu.Unlock()
	select {
	case <-b.done:
	case <-ctx.Done():
		return nil, fmt.Errorf("fake split rank %d: not every rank split: %w", c.rank, ctx.Err())
	case <-c.aborted:
		return nil, fmt.Errorf("fake split rank %d: %w", c.rank, gpu.ErrAborted)
	}
	if color == gpu.NoColor {
		return nil, nil
	}
	return join(ctx, b.cliques[color], c.dev, b.sizes[color], b.ranks[c.rank])
}

// ballot collects every rank's split color and key.
type ballot struct {
	colors  [][2]int
	n       int
	done    chan struct{}
	cliques map[int]*clique
	sizes   map[int]int
	ranks   []int // parent rank -> rank in its color's communicator
}

func (b *ballot) form() {
	b.cliques, b.sizes, b.ranks = map[int]*clique{}, map[int]int{}, make([]int, len(b.colors))
	members := map[int][]int{}
	for r, ck := range b.colors {
		if ck[0] != gpu.NoColor {
			members[ck[0]] = append(members[ck[0]], r)
		}
	}
	for color, rs := range members {
		// Order by key, then by parent rank, as NCCL does.
		slices.SortFunc(rs, func(a, z int) int {
			if c := cmp.Compare(b.colors[a][1], b.colors[z][1]); c != 0 {
				return c
			}
			return cmp.Compare(a, z)
		})
		for i, r := range rs {
			b.ranks[r] = i
		}
		b.sizes[color] = len(rs)
		b.cliques[color] = &clique{size: len(rs), formed: make(chan struct{}), meetings: map[uint64]*meeting{}}
	}
}
