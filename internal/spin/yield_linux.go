// Package spin holds how kolo's waits pass time without sleeping: Pause, one beat of a busy wait;
// Yield, which gives up the CPU; and Defaults, how long a wait polls or how often it yields before
// it sleeps.
package spin

import "syscall"

// Yield gives this thread's CPU to another runnable thread, if any (sched_yield): cheaper than a
// futex sleep and wake-up when ranks outnumber cores (DefaultYields has the measurements).
//
// It is a raw system call, which the Go scheduler does not see: with more ranks than cores a
// yield returns only after the other ranks ran, often past the 20 us after which the runtime's
// sysmon hands a P held by a thread in a system call to another thread, and taking it back then
// costs futex hand-offs between the process's threads on every yield. sched_yield never blocks,
// so the P can stay. Measured with `kolo bench allreduce --sizes 4` on a host with 2 cores, alternated:
// 195 and 192 us per op at 32 ranks against 413 and 407 us; 1.0 and 1.6 ms at 64 ranks against 6.2.
func Yield() { syscall.RawSyscall(syscall.SYS_SCHED_YIELD, 0, 0, 0) }
