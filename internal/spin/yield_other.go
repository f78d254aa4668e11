//go:build !linux

// Package spin holds how kolo's waits give up the CPU without sleeping.
package spin

import "runtime"

// Yield lets another goroutine run; without sched_yield this is the nearest portable thing.
func Yield() { runtime.Gosched() }
