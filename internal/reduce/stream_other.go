//go:build !amd64 || purego

package reduce

import "unsafe"

// hasStream: no streaming copy here; StreamCopy is copy.
const hasStream = false

func streamCopyAsm(dst, src unsafe.Pointer, n int) {
	panic("reduce: no streaming copy on this platform")
}
