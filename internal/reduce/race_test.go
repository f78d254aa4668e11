//go:build race

package reduce

// raceEnabled shrinks the multi-MiB cases: the race detector slows the reference tenfold and has
// nothing to find in single-goroutine kernels.
const raceEnabled = true
