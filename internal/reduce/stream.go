package reduce

import "unsafe"

// StreamCopy copies src into dst (which must have the same length and not overlap it) with
// non-temporal stores where the active kernel has them, so that dst's lines go to memory instead
// of staying in this core's cache.
//
// That is what data for another core wants where the two cores share no cache (the two vCPUs of
// an AMD EPYC virtual machine, say): there a line that one core wrote and another then reads, or
// that one core rewrites after another read it, moves core to core one round trip at a time,
// which held the staged 2-rank allreduce to OpenMPI's ~5.5 GB/s; staging through memory took it
// to 9-13 GB/s (`bench/compare.py`, docs/benchmarks.md). Data this core reads again soon must not
// be streamed: it would come back from memory.
//
// The stores are fenced before StreamCopy returns, so whatever the caller publishes next (an
// atomic flag, a barrier arrival) is ordered after them.
func StreamCopy(dst, src []byte) {
	if len(dst) != len(src) {
		panic("reduce.StreamCopy: dst and src differ in length")
	}
	if partialOverlap(dst, src) || (len(dst) > 0 && &dst[0] == &src[0]) {
		panic("reduce.StreamCopy: dst and src overlap")
	}
	if len(dst) == 0 {
		return
	}
	if active == nil || !hasStream {
		copy(dst, src)
		return
	}
	// Whole cache lines only: a partial line would be read for ownership anyway.
	head := int((-uintptr(unsafe.Pointer(&dst[0]))) & (streamAlign - 1))
	if head >= len(dst) {
		copy(dst, src)
		return
	}
	copy(dst[:head], src[:head])
	dst, src = dst[head:], src[head:]
	bulk := len(dst) &^ (streamUnit - 1)
	for off := 0; off < bulk; off += chunkBytes {
		n := min(chunkBytes, bulk-off)
		streamCopyAsm(unsafe.Pointer(&dst[off]), unsafe.Pointer(&src[off]), n)
	}
	copy(dst[bulk:], src[bulk:])
}

const (
	streamAlign = 64  // a cache line: the destination alignment the streaming body starts at
	streamUnit  = 128 // bytes per iteration of the streaming body
)
