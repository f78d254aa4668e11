package cpuset

import (
	"fmt"
	"syscall"
	"unsafe"
)

// maskWords bounds the CPU numbers handled (64 x 64 = 4096), as glibc's CPU_SETSIZE is 1024.
const maskWords = 64

// Current returns the CPUs the calling thread may run on.
func Current() (Set, error) { return Of(0) }

// Of returns the CPUs process pid (its main thread) may run on; 0 is the calling thread.
func Of(pid int) (Set, error) {
	var mask [maskWords]uint64
	// The raw syscall returns the number of bytes the kernel wrote, not 0.
	_, _, errno := syscall.RawSyscall(syscall.SYS_SCHED_GETAFFINITY, uintptr(pid), unsafe.Sizeof(mask), uintptr(unsafe.Pointer(&mask[0])))
	if errno != 0 {
		return nil, fmt.Errorf("sched_getaffinity of process %d: %w", pid, errno)
	}
	var s Set
	for w, bits := range mask {
		for b := range 64 {
			if bits&(1<<b) != 0 {
				s = append(s, w*64+b)
			}
		}
	}
	return s, nil
}

// Apply makes the calling OS thread run only on the CPUs of s; threads and processes it starts
// afterwards inherit that. The caller holds runtime.LockOSThread, or the mask lands on whatever
// thread the goroutine happens to be on.
func Apply(s Set) error {
	var mask [maskWords]uint64
	for _, c := range s {
		if c < 0 || c >= maskWords*64 {
			return fmt.Errorf("sched_setaffinity: CPU %d out of range", c)
		}
		mask[c/64] |= 1 << (c % 64)
	}
	_, _, errno := syscall.RawSyscall(syscall.SYS_SCHED_SETAFFINITY, 0, unsafe.Sizeof(mask), uintptr(unsafe.Pointer(&mask[0])))
	if errno != 0 {
		return fmt.Errorf("sched_setaffinity %s: %w", s, errno)
	}
	return nil
}
