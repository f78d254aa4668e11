//go:build !linux

// Package spin holds how kolo's waits pass time without sleeping: Pause, one beat of a busy wait;
// Yield, which gives up the CPU; and Defaults, how long a wait polls or how often it yields before
// it sleeps.
package spin

import "runtime"

// Yield lets another goroutine run; without sched_yield this is the nearest portable thing.
func Yield() { runtime.Gosched() }
