//go:build !purego

package reduce

import "unsafe"

// hasStream: the AVX2 streaming copy in stream_amd64.s runs wherever an accelerated kernel set does.
const hasStream = true

// streamCopyAsm copies n bytes (a multiple of streamUnit) from src to dst (streamAlign-aligned)
// with non-temporal stores, then fences them.
//
//go:noescape
func streamCopyAsm(dst, src unsafe.Pointer, n int)
