// Package spin holds how kolo's waits pass time without sleeping: Pause, one beat of a busy wait;
// Yield, which gives up the CPU; and Defaults, how long a wait polls or how often it yields before
// it sleeps.
package spin

import "syscall"

// Yield gives this thread's CPU to another runnable thread, if any (sched_yield): cheaper than a
// futex sleep and wake-up when ranks outnumber cores (DefaultYields has the measurements).
func Yield() { syscall.Syscall(syscall.SYS_SCHED_YIELD, 0, 0, 0) }
