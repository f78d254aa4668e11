//go:build !amd64

package spin

// procyield busy-waits for n beats of a counted loop, which touches no shared memory. The compiler
// keeps the loop: it removes no loops, and procyield is not inlined, so n is not known at the call.
//
//go:noinline
func procyield(n uint32) {
	for i := uint32(0); i < n; i++ {
	}
}
