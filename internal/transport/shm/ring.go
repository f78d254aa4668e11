//go:build linux

package shm

import "sync/atomic"

// ringEnd is one side of a single-producer single-consumer byte ring in the segment. The writer
// owns tail and the reader owns head; both are free-running 64-bit byte counters (they never wrap
// in practice), each on its own cache line, and each side keeps its own counter in pos so it reads
// only the other side's counter from shared memory.
//
// The writer copies data in and then publishes tail with an atomic store; the reader loads tail
// and only then copies out, so it never sees bytes before they are written (and symmetrically for
// head and free space).
//
// The data pages are not reserved until the writer first sends (Group.reserveRing sets ready on
// the writer's end), so the reader must not touch them before it has seen the tail move; its end
// maps them in then (ready on the reader's end). The controls are reserved from the start.
type ringEnd struct {
	data  []byte
	off   int64 // where data starts in the segment
	ready bool  // this end has reserved (writer) or mapped in (reader) the data pages
	size  uint64
	mine  *uint64 // tail for the writer, head for the reader
	other *uint64
	pos   uint64
	chunk uint64   // most bytes moved before publishing, so the other side can start early
	peer  doorbell // rung after publishing: the other side may sleep on it
}

// maxChunk is the most a ring end copies before it publishes: small enough that the two sides copy
// in parallel (and the chunk stays in cache between them), large enough that publishing and
// waking cost little per byte. On a 2-core host 64 KiB chunks moved a 4 MiB ring exchange several
// times faster than 256 KiB ones (`go test -bench RingExchange ./internal/transport/shm`).
const maxChunk = 64 << 10

func newRingEnd(mem []byte, ctl, data int64, size int, writer bool, peer doorbell) ringEnd {
	tail, head := u64(mem, ctl+ctlTail), u64(mem, ctl+ctlHead)
	r := ringEnd{data: mem[data : data+int64(size) : data+int64(size)], off: data, size: uint64(size),
		chunk: uint64(max(min(size/4, maxChunk), 1)), peer: peer}
	if writer {
		r.mine, r.other = tail, head
	} else {
		r.mine, r.other = head, tail
	}
	r.pos = atomic.LoadUint64(r.mine)
	return r
}

// free is the room left for the writer.
func (r *ringEnd) free() uint64 { return r.size - (r.pos - atomic.LoadUint64(r.other)) }

// avail is the number of bytes the reader may take.
func (r *ringEnd) avail() uint64 { return atomic.LoadUint64(r.other) - r.pos }

func (r *ringEnd) writable() bool { return r.free() > 0 }
func (r *ringEnd) readable() bool { return r.avail() > 0 }

// copyIn writes b at the writer's position without publishing it; b must fit in free().
func (r *ringEnd) copyIn(b []byte) {
	n := copy(r.data[r.pos%r.size:], b)
	copy(r.data, b[n:])
	r.pos += uint64(len(b))
}

// mapIn maps the ring's pages into this process the first time the reader finds data in it, so
// that reading pays one system call rather than a fault per page. The writer reserved them before
// publishing the tail this end has seen (an atomic load ordered after the writer's fallocate), so
// the faults cannot hit a hole. A failure is left to the faults it was to spare: the pages exist.
func (r *ringEnd) mapIn() {
	if !r.ready {
		populate(r.data)
		r.ready = true
	}
}

// copyOut reads len(b) bytes at the reader's position without publishing; they must be avail().
func (r *ringEnd) copyOut(b []byte) {
	n := copy(b, r.data[r.pos%r.size:])
	copy(b[n:], r.data)
	r.pos += uint64(len(b))
}

// publish makes everything copied so far visible to the other side and wakes it if it sleeps.
func (r *ringEnd) publish() {
	atomic.StoreUint64(r.mine, r.pos)
	r.peer.ring()
}

// put writes as much of b as fits (at most one chunk) and publishes it.
func (r *ringEnd) put(b []byte) int {
	n := min(uint64(len(b)), r.free(), r.chunk)
	if n == 0 {
		return 0
	}
	r.copyIn(b[:n])
	r.publish()
	return int(n)
}

// get fills as much of b as is available (at most one chunk) and publishes the freed space.
func (r *ringEnd) get(b []byte) int {
	n := min(uint64(len(b)), r.avail(), r.chunk)
	if n == 0 {
		return 0
	}
	r.mapIn()
	r.copyOut(b[:n])
	r.publish()
	return int(n)
}

// peek returns the available bytes as up to two slices of the ring (before and after the wrap)
// without consuming them; skip consumes.
func (r *ringEnd) peek() (a, b []byte) {
	n := r.avail()
	if n == 0 {
		return nil, nil
	}
	r.mapIn()
	p := r.pos % r.size
	if p+n <= r.size {
		return r.data[p : p+n], nil
	}
	return r.data[p:], r.data[:p+n-r.size]
}

func (r *ringEnd) skip(n int) {
	r.pos += uint64(n)
	r.publish()
}
