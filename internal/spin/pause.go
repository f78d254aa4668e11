package spin

// pauses is how many times Pause hints the CPU that it spins: a few hundred cycles to a couple of
// microseconds, depending on how long the CPU makes a PAUSE last (about 10 cycles on older x86
// cores, 140 on Skylake).
const pauses = 16

// Pause is one beat of a busy wait: a short delay that writes no memory, so spinning cores do not
// bounce a shared cache line between them, and that does not enter the scheduler. It is not
// runtime.Gosched: a goroutine that entered Go from a foreign thread (the Python binding's calls
// through cgo) is locked to that thread, and Gosched there hands the thread's P to another thread
// and puts this one to sleep until the scheduler hands it back, two futex calls and two context
// switches per beat (measured through the Python binding, 2 ranks: ~2.8 context switches per
// 4-byte allreduce and a 20 µs floor).
func Pause() { procyield(pauses) }
