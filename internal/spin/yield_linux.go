// Package spin holds how kolo's waits give up the CPU without sleeping.
package spin

import "syscall"

// Yield gives this thread's CPU to another runnable thread, if any (sched_yield): cheaper than a
// futex sleep and wake-up when ranks outnumber cores (engine.DefaultYields has the measurements).
func Yield() { syscall.Syscall(syscall.SYS_SCHED_YIELD, 0, 0, 0) }
