// Package fake is a device backend on host memory, so that the engine's device logic (streams,
// events, fusion buffers in device memory, communicators and their abort) is tested in CI without a
// GPU, under the race detector, as internal/transport/inmem serves the host path.
//
// It keeps the semantics of CUDA and NCCL that the engine relies on, not more: a stream runs its
// work in order on its own goroutine, so the host only waits where it synchronises; a collective
// completes when every rank of its communicator has reached it, matched by call order as NCCL
// matches, so a lost rank leaves its peers blocked exactly where NCCL blocks, until each one
// aborts. It must not be used for real tensors, and must not grow conveniences CUDA lacks.
package fake

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/kolo-dl/kolo/internal/gpu"
)

// Every allocation gets its own 4 GiB window of the fake address space, so an address names its
// allocation (the high bits) and an offset in it (the low bits), and an address from another
// fake device is recognised as foreign.
const (
	windowBits = 32
	maxAlloc   = 1 << windowBits
)

var nextWindow atomic.Uint64 // shared by every Device: windows are never reused

// Device is a fake accelerator: memory is host memory, streams are goroutines.
type Device struct {
	mu      sync.Mutex
	mem     map[uint64][]byte // window -> allocation
	streams map[uintptr]*Stream
}

var _ gpu.Device = (*Device)(nil)

// NewDevice returns an empty device.
func NewDevice() *Device {
	return &Device{mem: map[uint64][]byte{}, streams: map[uintptr]*Stream{}}
}

// Alloc implements gpu.Device. Fresh memory is filled with 0xA5, not zero, as device memory is
// not zeroed either.
func (d *Device) Alloc(n int) (gpu.Ptr, error) {
	if n < 0 || n >= maxAlloc {
		return 0, fmt.Errorf("fake alloc of %d bytes: out of range", n)
	}
	buf := make([]byte, n)
	for i := range buf {
		buf[i] = 0xA5
	}
	w := nextWindow.Add(1)
	d.mu.Lock()
	d.mem[w] = buf
	d.mu.Unlock()
	return gpu.Ptr(w << windowBits), nil
}

// Free implements gpu.Device.
func (d *Device) Free(p gpu.Ptr) error {
	w, off := uint64(p)>>windowBits, uint64(p)&(maxAlloc-1)
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.mem[w]; !ok || off != 0 {
		return fmt.Errorf("fake free of %#x: not an allocation of this device", uintptr(p))
	}
	delete(d.mem, w)
	return nil
}

// Bytes is the host view of n bytes at p, what cudaMemcpy to or from the host would touch: tests
// fill inputs and read results through it.
func (d *Device) Bytes(p gpu.Ptr, n int) ([]byte, error) {
	w, off := uint64(p)>>windowBits, int(uint64(p)&(maxAlloc-1))
	d.mu.Lock()
	buf, ok := d.mem[w]
	d.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("fake address %#x: not in this device's memory", uintptr(p))
	}
	if n < 0 || off+n > len(buf) {
		return nil, fmt.Errorf("fake address %#x + %d bytes: past the end of a %d-byte allocation", uintptr(p), n, len(buf))
	}
	return buf[off : off+n : off+n], nil
}

// NewStream implements gpu.Device.
func (d *Device) NewStream() (gpu.Stream, error) {
	s := newStream(d, true)
	d.mu.Lock()
	d.streams[s.Handle()] = s
	d.mu.Unlock()
	return s, nil
}

// WrapStream implements gpu.Device: the handle is one a Stream of this device gave (Handle),
// standing for the stream torch would pass.
func (d *Device) WrapStream(handle uintptr) (gpu.Stream, error) {
	d.mu.Lock()
	s, ok := d.streams[handle]
	d.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("fake stream handle %#x: not a stream of this device", handle)
	}
	return &borrowed{s}, nil
}

// NewEvent implements gpu.Device.
func (d *Device) NewEvent() (gpu.Event, error) { return newEvent(), nil }

// borrowed is an adopted stream: its owner destroys it.
type borrowed struct{ *Stream }

func (b *borrowed) Destroy() error { return nil }
