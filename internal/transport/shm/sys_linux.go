//go:build linux

package shm

import (
	"bytes"
	"errors"
	"fmt"
	"github.com/kolo-dl/kolo/internal/spin"
	"math"
	"os"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// Futex operations without FUTEX_PRIVATE_FLAG: the words live in a shared mapping and the waker is
// usually another process, which a private futex would never see.
const (
	futexWaitOp = 0
	futexWakeOp = 1
)

// futexWait sleeps while *addr == val, for at most d. Spurious returns are fine: every caller
// re-checks its condition.
func futexWait(addr *uint32, val uint32, d time.Duration) {
	ts := syscall.NsecToTimespec(int64(d))
	syscall.Syscall6(syscall.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWaitOp, uintptr(val),
		uintptr(unsafe.Pointer(&ts)), 0, 0)
}

func futexWakeAll(addr *uint32) {
	syscall.Syscall6(syscall.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWakeOp, math.MaxInt32, 0, 0, 0)
}

// doorbell is a futex word and a count of its sleepers. A waker that changed the condition rings
// only when someone sleeps, so the fast path of a transfer costs no system call.
//
// The protocol is Dekker's: the sleeper increments waiters, then re-checks its condition; the waker
// publishes its change, then reads waiters. Both are sequentially consistent atomics, so at least
// one side sees the other's write: either the sleeper sees the change and does not sleep, or the
// waker sees the sleeper and bumps the word, which makes FUTEX_WAIT return at once or wakes it.
type doorbell struct {
	word, waiters *uint32
}

// sleep waits for ring() or until d passes, unless ready() already holds.
func (b doorbell) sleep(ready func() bool, d time.Duration) {
	v := atomic.LoadUint32(b.word)
	atomic.AddUint32(b.waiters, 1)
	if !ready() {
		futexWait(b.word, v, d)
	}
	atomic.AddUint32(b.waiters, ^uint32(0))
}

// ring wakes the sleepers, if any.
func (b doorbell) ring() {
	if atomic.LoadUint32(b.waiters) != 0 {
		b.kick()
	}
}

// kick wakes the sleepers unconditionally: for close, abort and cancellation, which change no
// condition a sleeper's ready() looks at.
func (b doorbell) kick() {
	atomic.AddUint32(b.word, 1)
	futexWakeAll(b.word)
}

// spinUntil polls ready for up to d, or, when d <= 0, yields the CPU between polls up to yields
// times. It reads the clock only every 64 polls.
func spinUntil(ready func() bool, d time.Duration, yields int) bool {
	if ready() {
		return true
	}
	if d <= 0 {
		for range yields {
			spin.Yield()
			if ready() {
				return true
			}
		}
		return false
	}
	start := time.Now()
	for i := 1; ; i++ {
		if ready() {
			return true
		}
		if i%64 == 0 && time.Since(start) > d {
			return false
		}
	}
}

// procStat returns the start time of process pid (clock ticks since boot, field 22 of
// /proc/<pid>/stat) and its state letter.
func procStat(pid int) (start uint64, state byte, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	// The command name (field 2) is in parentheses and may contain anything, so parse after the
	// last ')': " S ppid ..." where S is field 3 and start time is field 22.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 20 {
		return 0, 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	start, err = strconv.ParseUint(string(f[19]), 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("malformed /proc/%d/stat: %w", pid, err)
	}
	return start, f[0][0], nil
}

// processGone returns why process pid (started at start, 0 if unknown) is no longer running, or nil.
// A killed child that its parent has not reaped yet is a zombie and still answers kill(pid, 0),
// and a pid may be reused; /proc tells both apart. Without /proc, kill alone decides.
func processGone(pid int, start uint64) error {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("process %d exited", pid)
	}
	s, state, err := procStat(pid)
	switch {
	case errors.Is(err, os.ErrNotExist):
		if _, err := os.Stat("/proc/self/stat"); err == nil {
			return fmt.Errorf("process %d exited", pid)
		}
	case err != nil:
	case state == 'Z' || state == 'X':
		return fmt.Errorf("process %d exited", pid)
	case start != 0 && s != start:
		return fmt.Errorf("process %d exited (pid reused)", pid)
	}
	return nil
}

// pidNamespace identifies this process's pid namespace (0 if unknown). Ranks of one host may share
// /dev/shm from different containers; a peer's pid is only meaningful in the same namespace.
func pidNamespace() uint64 {
	var st syscall.Stat_t
	if syscall.Stat("/proc/self/ns/pid", &st) != nil {
		return 0
	}
	return st.Ino
}

// populate maps every page of m into this process's page tables now, so no operation pays a page
// fault later. The pages must have been reserved (fallocate) first: on a tmpfs, faulting in a page
// of a hole allocates it, and when the file system is full that fault is a SIGBUS. MADV_POPULATE_WRITE
// reports that case as an error instead, but the fallback for older kernels cannot.
func populate(m []byte) error {
	const madvPopulateWrite = 23 // Linux 5.14
	if len(m) == 0 {
		return nil
	}
	for {
		_, _, e := syscall.Syscall(syscall.SYS_MADVISE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), madvPopulateWrite)
		switch e {
		case 0:
			return nil
		case syscall.EINTR, syscall.EAGAIN:
			continue
		case syscall.EINVAL: // a kernel older than the advice
		default:
			return fmt.Errorf("madvise(MADV_POPULATE_WRITE) %d bytes: %w", len(m), e)
		}
		break
	}
	// Older kernels: touch every page by reading it (a read leaves the contents alone, which
	// matters because peers may already be writing their rings).
	// An atomic load, so the compiler cannot drop it; every offset is page-aligned.
	for i := 0; i < len(m); i += pageBytes {
		atomic.LoadUint32((*uint32)(unsafe.Pointer(&m[i])))
	}
	return nil
}

// reserve allocates bytes [off, off+n) of the file fd, so that faulting them in later cannot fail
// for want of space. On a file system that cannot reserve (no fallocate), it does nothing and the
// pages are allocated as they are first touched, as with any file there.
func reserve(fd int, off, n int64) error {
	for {
		err := syscall.Fallocate(fd, 0, off, n)
		switch {
		case err == syscall.EINTR:
			// tmpfs gives up a long fallocate when a signal arrives, and the Go runtime sends
			// them (preemption): the space it took is released, so try again.
			continue
		case err == syscall.EOPNOTSUPP || err == syscall.ENOSYS:
			return nil
		}
		return err
	}
}

// freeSpace says how much room the file system of fd has left, for errors about a full /dev/shm.
func freeSpace(fd int) string {
	var st syscall.Statfs_t
	if syscall.Fstatfs(fd, &st) != nil {
		return "unknown"
	}
	if st.Blocks == 0 {
		return "unknown (no size limit)" // a tmpfs mounted with size=0 reports no blocks
	}
	free := int64(st.Bavail) * int64(st.Bsize)
	if free < 1<<20 {
		return fmt.Sprintf("%d KiB", free>>10)
	}
	return fmt.Sprintf("%d MiB", free>>20) // rounded down, unlike a need: never promise room
}

// sizeText writes a byte count needed in the unit that keeps it short: KiB below a MiB, else MiB
// to a tenth, both rounded up (a need rounded down would promise room that is not there).
func sizeText(n int64) string {
	if n < 1<<20 {
		return fmt.Sprintf("%d KiB", (n+1<<10-1)>>10)
	}
	tenths := (n*10 + 1<<20 - 1) >> 20
	if tenths%10 == 0 {
		return fmt.Sprintf("%d MiB", tenths/10)
	}
	return fmt.Sprintf("%d.%d MiB", tenths/10, tenths%10)
}

// oTmpfile is O_TMPFILE (with the O_DIRECTORY bit it includes) as amd64, arm64 and riscv64 number
// it (asm-generic); the syscall package does not name it.
const oTmpfile = 0x410000

// linkFD gives the unnamed file fd (opened with O_TMPFILE) the name path, failing with EEXIST if
// path exists. It links through /proc/self/fd, which needs no privilege (AT_EMPTY_PATH would).
func linkFD(fd int, path string) error {
	const atSymlinkFollow = 0x400
	atFdcwd := -100 // AT_FDCWD
	from, err := syscall.BytePtrFromString("/proc/self/fd/" + strconv.Itoa(fd))
	if err != nil {
		return err
	}
	to, err := syscall.BytePtrFromString(path)
	if err != nil {
		return err
	}
	_, _, e := syscall.Syscall6(syscall.SYS_LINKAT, uintptr(atFdcwd), uintptr(unsafe.Pointer(from)),
		uintptr(atFdcwd), uintptr(unsafe.Pointer(to)), atSymlinkFollow, 0)
	if e != 0 {
		return e
	}
	return nil
}
