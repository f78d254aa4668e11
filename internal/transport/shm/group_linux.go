//go:build linux

package shm

import (
	"context"
	"errors"
	"fmt"
	"github.com/kolo-dl/kolo/internal/spin"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/kolo-dl/kolo/internal/transport"
)

// How often a sleeping wait wakes up to check its context, the abort word, its peers' processes and
// its progress deadline. It bounds how long a killed peer goes unnoticed.
const (
	checkEvery       = 50 * time.Millisecond
	readerCheckEvery = 100 * time.Millisecond
)

// frozenGap: two checks of one wait this far apart (they are at most checkEvery apart while the
// process runs) mean that the process itself did not run meanwhile, stopped or suspended, so the
// peers it waits on are not to blame for that time: the wait's progress clock starts again.
const frozenGap = time.Second

var errPeerClosed = errors.New("peer closed its shm transport")

// errNoProgress is what a Comm wait returns when its progress deadline passed; the call turns it
// into a *transport.StallError naming the peer.
var errNoProgress = errors.New("no progress")

// Group is this rank's attachment to the host's segment. Comm and Messenger are views of it; Close
// releases it.
type Group struct {
	cfg    Config
	lay    layout
	path   string
	rank   int
	size   int
	pids   []int    // every rank's pid, from the header
	starts []uint64 // every rank's process start time, to tell a reused pid
	procs  []bool   // whether a rank's process can be checked from here (same pid namespace)

	// fd is the segment file, kept open after rank 0 unlinks it because each rank reserves the
	// rings it sends on at their first use (reserve needs a descriptor; the mapping alone pins
	// the file, so keeping it costs one descriptor and no memory). Closed with the mapping.
	fd int

	// mu guards the mapping against Close: every operation holds it shared while it touches mem,
	// and the mapping is released under the exclusive lock once Comm and Messenger are both closed.
	mu       sync.RWMutex
	mem      []byte
	released bool

	commClosed atomic.Bool
	msgClosed  atomic.Bool
	closeMu    sync.Mutex // serialises closing the two halves

	abortErr atomic.Pointer[error] // cached once the abort word is seen

	// spinNs is how long waits poll before they sleep (cfg.Spin at first; SetSpin changes it):
	// <= 0, never.
	spinNs atomic.Int64

	comm *comm
	msgr *messenger
}

// Open attaches this rank to the host's segment: rank 0 creates it, the others wait for it, and
// every rank returns once all Size ranks have attached (rank 0 then unlinks the file). It fails
// after cfg.Timeout or when ctx ends, saying which segment and which ranks were missing.
func Open(ctx context.Context, cfg Config) (*Group, error) {
	cfg, err := cfg.normalize()
	if err != nil {
		return nil, err
	}
	lay := newLayout(cfg)
	if lay.total > int64(^uint(0)>>1) {
		return nil, fmt.Errorf("shm: segment %q of %d bytes does not fit this address space", cfg.Name, lay.total)
	}
	path := filepath.Join(cfg.Dir, cfg.Name)
	begin := time.Now()
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()

	var mem []byte
	var fd int
	if cfg.Rank == 0 {
		if removed, _ := Sweep(cfg.Dir); len(removed) > 0 {
			slog.Info("shm: removed segments that jobs which died during start-up left behind", "paths", removed)
		}
		mem, fd, err = create(path, lay)
	} else {
		mem, fd, err = attach(ctx, begin, path, cfg, lay)
	}
	if err != nil {
		return nil, err
	}
	g := &Group{cfg: cfg, lay: lay, path: path, rank: cfg.Rank, size: cfg.Size, mem: mem, fd: fd}
	g.spinNs.Store(int64(cfg.Spin))
	if err := g.join(ctx, begin); err != nil {
		if g.rank == 0 {
			g.abort(fmt.Sprintf("rank 0 gave up waiting for ranks to attach: %v", err))
			if uerr := os.Remove(path); uerr != nil && !errors.Is(uerr, os.ErrNotExist) {
				slog.Warn("shm: cannot remove segment after a failed open", "path", path, "err", uerr)
			}
		}
		syscall.Munmap(mem)
		syscall.Close(fd)
		return nil, err
	}
	g.comm = newComm(g)
	g.msgr = newMessenger(g)
	return g, nil
}

// shmAdvice is what to do about a /dev/shm too small for the segment.
const shmAdvice = "a container's /dev/shm is 64 MiB unless raised: run it with --ipc=host or --shm-size=1g, or in Kubernetes mount an emptyDir with medium Memory at /dev/shm"

// create makes the segment file, reserves the part every rank touches at once (header, ring
// controls and slots: a full /dev/shm fails here with a message instead of a SIGBUS on some later
// page fault), sizes the file for the rings too, which stay a hole until first used, maps it and
// writes the header, the ready word last. The file gets its name only then (sweep_linux.go), so a
// named segment always says who created it.
func create(path string, lay layout) ([]byte, int, error) {
	fd, named, err := openNew(path)
	if errors.Is(err, syscall.EEXIST) {
		return nil, -1, errExists(path, err)
	}
	if err != nil {
		return nil, -1, fmt.Errorf("shm: create segment %s: %w", path, err)
	}
	var mem []byte
	fail := func(err error) ([]byte, int, error) {
		if mem != nil {
			syscall.Munmap(mem)
		}
		syscall.Close(fd)
		if named {
			syscall.Unlink(path)
		}
		return nil, -1, err
	}
	// Sized before anything is reserved: a rank attaching meanwhile must never see a size short of
	// the total (reserving the start first made the file that long for a moment, and a rank that
	// read that size and then the ready word took the segment for another config).
	if err := syscall.Ftruncate(fd, lay.total); err != nil {
		return fail(fmt.Errorf("shm: size segment %s to %d bytes: %w", path, lay.total, err))
	}
	rings := lay.total - lay.reserved()
	if err := reserve(fd, 0, lay.reserved()); err != nil {
		return fail(fmt.Errorf("shm: segment %s needs %s at start (its rings may take up to %s more, each at its first use) but %s has %s free (%s): %w",
			path, sizeText(lay.reserved()), sizeText(rings), filepath.Dir(path), freeSpace(fd), shmAdvice, err))
	}
	var st syscall.Statfs_t
	if syscall.Fstatfs(fd, &st) == nil && st.Blocks > 0 && int64(st.Bavail)*int64(st.Bsize) < rings {
		// Not an error: most jobs use few of the rings. One that uses many (alltoall) fails at
		// the Send that first needs a ring that does not fit, and says so then.
		slog.Warn("shm: not every ring of the segment fits the free space; a Send that first needs one that does not fit will fail",
			"path", path, "reserved", sizeText(lay.reserved()), "rings_at_most", sizeText(rings),
			"free", freeSpace(fd), "fix", shmAdvice)
	}
	mem, err = syscall.Mmap(fd, 0, int(lay.total), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		mem = nil
		return fail(fmt.Errorf("shm: map segment %s (%d bytes): %w", path, lay.total, err))
	}
	start, _, _ := procStat(os.Getpid())
	*u64(mem, offMagic) = segmentMagic
	*u32(mem, offVersion) = segmentVersion
	*u32(mem, offSize) = uint32(lay.size)
	*u64(mem, offSlotBytes) = uint64(lay.slotBytes)
	*u64(mem, offRingBytes) = uint64(lay.ringBytes)
	*u64(mem, offMsgRingBytes) = uint64(lay.msgRingBytes)
	*u64(mem, offTotal) = uint64(lay.total)
	*u64(mem, offCreatorPid) = uint64(os.Getpid())
	*u64(mem, offCreatorStart) = start
	*u64(mem, offCreatorPidNS) = pidNamespace()
	*u32(mem, offHostCPUs) = uint32(spin.HostCPUs())
	atomic.StoreUint32(u32(mem, offReady), headerReadyMarker)
	if !named {
		if err := linkFD(fd, path); errors.Is(err, syscall.EEXIST) {
			return fail(errExists(path, err))
		} else if err != nil {
			return fail(fmt.Errorf("shm: name segment %s: %w", path, err))
		}
	}
	return mem, fd, nil
}

func errExists(path string, err error) error {
	return fmt.Errorf("shm: segment %s already exists: another job on this host uses the same name, or one that is still starting; remove it if no job is running: %w", path, err)
}

// openNew opens a new, unnamed file in path's directory (O_TMPFILE), for linkFD to name once it is
// complete; named is false then. Where the file system or the kernel cannot (no O_TMPFILE, no
// /proc to link through), it creates path itself, exclusively, and named is true.
func openNew(path string) (fd int, named bool, err error) {
	if _, err := os.Stat("/proc/self/fd"); err == nil {
		fd, err := syscall.Open(filepath.Dir(path), oTmpfile|syscall.O_RDWR|syscall.O_CLOEXEC, 0o600)
		if err == nil {
			return fd, false, nil
		}
		if !errors.Is(err, syscall.EOPNOTSUPP) && !errors.Is(err, syscall.EISDIR) && !errors.Is(err, syscall.EINVAL) {
			return -1, false, err
		}
	}
	fd, err = syscall.Open(path, syscall.O_RDWR|syscall.O_CREAT|syscall.O_EXCL|syscall.O_CLOEXEC, 0o600)
	return fd, true, err
}

// attach waits for rank 0's segment to exist and be ready, maps it and checks that it was made
// for the same config.
func attach(ctx context.Context, begin time.Time, path string, cfg Config, lay layout) ([]byte, int, error) {
	why := "the file does not exist"
	for delay := time.Millisecond; ; delay = min(2*delay, 20*time.Millisecond) {
		mem, fd, err := tryAttach(path, lay)
		if err == nil {
			return mem, fd, nil
		}
		var notYet errNotYet
		if !errors.As(err, &notYet) {
			return nil, -1, err
		}
		why = string(notYet)
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, -1, fmt.Errorf("shm: rank %d: segment %s not ready after %v: %s (is local rank 0 running with the same segment name?): %w",
				cfg.Rank, path, time.Since(begin).Round(time.Millisecond), why, context.Cause(ctx))
		case <-t.C:
		}
	}
}

type errNotYet string

func (e errNotYet) Error() string { return string(e) }

func tryAttach(path string, lay layout) ([]byte, int, error) {
	fd, err := syscall.Open(path, syscall.O_RDWR|syscall.O_CLOEXEC, 0)
	if errors.Is(err, syscall.ENOENT) {
		return nil, -1, errNotYet("the file does not exist")
	}
	if err != nil {
		return nil, -1, fmt.Errorf("shm: open segment %s: %w", path, err)
	}
	fail := func(err error) ([]byte, int, error) {
		syscall.Close(fd)
		return nil, -1, err
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return fail(fmt.Errorf("shm: stat segment %s: %w", path, err))
	}
	if st.Size < globalBytes {
		return fail(errNotYet("rank 0 is still creating it"))
	}
	mem, err := syscall.Mmap(fd, 0, int(st.Size), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return fail(fmt.Errorf("shm: map segment %s (%d bytes): %w", path, st.Size, err))
	}
	if err := checkHeader(path, mem, lay, st.Size); err != nil {
		syscall.Munmap(mem)
		if errors.Is(err, errStale) {
			unlinkIfSame(path, &st)
		}
		return fail(err)
	}
	return mem, fd, nil
}

func checkHeader(path string, mem []byte, lay layout, fileSize int64) error {
	if atomic.LoadUint32(u32(mem, offReady)) != headerReadyMarker {
		return errNotYet("rank 0 has not initialised it yet")
	}
	if *u64(mem, offMagic) != segmentMagic || *u32(mem, offVersion) != segmentVersion {
		return fmt.Errorf("shm: %s is not a kolo shm segment of version %d", path, segmentVersion)
	}
	got := fmt.Sprintf("size=%d slot=%d ring=%d msgring=%d bytes=%d", *u32(mem, offSize), *u64(mem, offSlotBytes),
		*u64(mem, offRingBytes), *u64(mem, offMsgRingBytes), *u64(mem, offTotal))
	want := fmt.Sprintf("size=%d slot=%d ring=%d msgring=%d bytes=%d", lay.size, lay.slotBytes, lay.ringBytes,
		lay.msgRingBytes, lay.total)
	if got != want || fileSize != lay.total {
		return fmt.Errorf("shm: segment %s was created for %s (file %d bytes), but this rank is configured for %s: every local rank must use the same config",
			path, got, fileSize, want)
	}
	pid, start := int(*u64(mem, offCreatorPid)), *u64(mem, offCreatorStart)
	if !samePidNS(*u64(mem, offCreatorPidNS)) {
		return nil
	}
	if err := processGone(pid, start); err != nil {
		return fmt.Errorf("shm: segment %s: %w: its creator, local rank 0, is gone (%v)", path, errStale, err)
	}
	return nil
}

// errStale marks a segment whose creator is gone: whoever finds it removes it (sweep_linux.go).
var errStale = errors.New("stale segment")

// populateMine maps into this process the pages every rank touches from the start: the header,
// the ring controls and every slot (the shared collectives read every rank's), all reserved by
// rank 0, so that no operation pays a page fault on them. A ring is mapped in by its sender when
// it first sends on it (reserveRing) and by its receiver when it first finds data in it.
func (g *Group) populateMine() error {
	if err := populate(g.mem[:g.lay.reserved()]); err != nil {
		return fmt.Errorf("shm: rank %d: map the header and slots of segment %s: %w", g.rank, g.path, err)
	}
	return nil
}

// reserveRing reserves and maps in ring r, which this rank sends on to peer, unless it did so
// already: the writer must do it before it writes a byte, and does it only once it needs the
// ring, so that /dev/shm holds only the rings a job uses. Being the ring's only writer, it needs
// no coordination with the reader, which touches the data only after the tail moved, so after
// this returned. kind names the ring in errors ("data", "message"). The caller holds g.mu shared.
func (g *Group) reserveRing(r *ringEnd, kind string, peer int) error {
	if r.ready {
		return nil
	}
	n := int64(len(r.data))
	if err := reserve(g.fd, r.off, n); err != nil {
		names := fmt.Sprintf("local ranks %d->%d", g.rank, peer)
		if g.cfg.Ranks != nil {
			names += fmt.Sprintf(" (job ranks %d->%d)", g.cfg.Ranks[g.rank], g.cfg.Ranks[peer])
		}
		advice := ""
		if errors.Is(err, syscall.ENOSPC) {
			advice = "; " + shmAdvice
		}
		return fmt.Errorf("reserve the %s ring %s of segment %s at its first use: it needs %s but %s has %s free (the segment reserved %s at start, and its rings may add up to %s, each at its first use%s): %w",
			kind, names, g.path, sizeText(n), filepath.Dir(g.path), freeSpace(g.fd), sizeText(g.lay.reserved()),
			sizeText(g.lay.total-g.lay.reserved()), advice, err)
	}
	if err := populate(r.data); err != nil {
		return fmt.Errorf("map in the %s ring to local rank %d of segment %s: %w", kind, peer, g.path, err)
	}
	r.ready = true
	return nil
}

// join claims this rank's block, maps the pages it uses, counts this rank in and waits for the others.
func (g *Group) join(ctx context.Context, begin time.Time) error {
	state := g.u32(g.lay.rankBlock(g.rank) + rState)
	if !atomic.CompareAndSwapUint32(state, 0, stateAttached) {
		pid := atomic.LoadUint64(g.u64(g.lay.rankBlock(g.rank) + rPid))
		return fmt.Errorf("shm: segment %s: local rank %d is already attached (pid %d): two processes were given the same local rank",
			g.path, g.rank, pid)
	}
	start, _, _ := procStat(os.Getpid())
	atomic.StoreUint64(g.u64(g.lay.rankBlock(g.rank)+rStart), start)
	atomic.StoreUint64(g.u64(g.lay.rankBlock(g.rank)+rPidNS), pidNamespace())
	atomic.StoreUint64(g.u64(g.lay.rankBlock(g.rank)+rPid), uint64(os.Getpid()))
	if err := g.populateMine(); err != nil {
		atomic.OrUint32(state, stateCommClosed|stateMsgClosed)
		g.abort(err.Error()) // the others would wait for this rank until their timeout
		return err
	}
	attached := g.u32(offAttached)
	atomic.AddUint32(attached, 1)

	creator, creatorStart := int(*g.u64(offCreatorPid)), *g.u64(offCreatorStart)
	checkCreator := g.rank != 0 && samePidNS(*g.u64(offCreatorPidNS))
	for delay := 100 * time.Microsecond; atomic.LoadUint32(attached) < uint32(g.size); delay = min(2*delay, 5*time.Millisecond) {
		if err := g.aborted(); err != nil {
			return fmt.Errorf("shm: rank %d: segment %s: %w", g.rank, g.path, err)
		}
		if checkCreator {
			if err := processGone(creator, creatorStart); err != nil {
				// Nobody else may be left to remove it: rank 0 died before it could.
				var st syscall.Stat_t
				if syscall.Fstat(g.fd, &st) == nil {
					unlinkIfSame(g.path, &st)
				}
				return fmt.Errorf("shm: rank %d: segment %s: local rank 0 is gone (%v)", g.rank, g.path, err)
			}
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			atomic.OrUint32(state, stateCommClosed|stateMsgClosed)
			return fmt.Errorf("shm: rank %d: segment %s: only %d of %d ranks attached after %v (missing local ranks %v): %w",
				g.rank, g.path, atomic.LoadUint32(attached), g.size, time.Since(begin).Round(time.Millisecond), g.missingRanks(), context.Cause(ctx))
		case <-t.C:
		}
	}
	if g.rank == 0 {
		if err := os.Remove(g.path); err != nil {
			slog.Warn("shm: cannot unlink segment after all ranks attached; it stays in /dev/shm until removed",
				"path", g.path, "err", err)
		}
	}
	g.pids = make([]int, g.size)
	g.starts = make([]uint64, g.size)
	g.procs = make([]bool, g.size)
	for r := range g.size {
		g.pids[r] = int(atomic.LoadUint64(g.u64(g.lay.rankBlock(r) + rPid)))
		g.starts[r] = atomic.LoadUint64(g.u64(g.lay.rankBlock(r) + rStart))
		g.procs[r] = samePidNS(atomic.LoadUint64(g.u64(g.lay.rankBlock(r) + rPidNS)))
		if !g.procs[r] {
			slog.Warn("shm: local rank runs in another pid namespace; its death is noticed only through its state word or the caller's deadline",
				"segment", g.path, "rank", r, "pid", g.pids[r])
		}
	}
	return nil
}

// samePidNS reports whether a pid recorded by a process in namespace ns can be checked from here.
func samePidNS(ns uint64) bool {
	mine := pidNamespace()
	return ns == 0 || mine == 0 || ns == mine
}

func (g *Group) missingRanks() []int {
	var missing []int
	for r := range g.size {
		if atomic.LoadUint32(g.u32(g.lay.rankBlock(r)+rState))&stateAttached == 0 {
			missing = append(missing, r)
		}
	}
	return missing
}

// Comm returns the stream transport over the segment. The value also implements transport.Shared.
// Closing it closes only the Comm half; the segment is released when both halves are closed.
func (g *Group) Comm() transport.Comm { return g.comm }

// Messenger returns the framed-message transport over the segment. It is also a transport.Poller;
// read through Inbox, its reader goroutine runs from the first Inbox call until the Messenger (or
// the Group) is closed.
func (g *Group) Messenger() transport.Messenger { return g.msgr }

// Abort makes every current and future Comm call and Barrier of every rank of the segment that
// has to wait fail with an error that matches ErrAborted and carries err's text (one whose bytes
// or arrivals are already there still completes): the engine calls it when some rank
// is lost, so ranks waiting on each other here do not wait for their own timeouts. The first Abort
// wins. The Messenger is not affected: it is how ranks may still tell each other why.
func (g *Group) Abort(err error) {
	g.mu.RLock()
	defer g.mu.RUnlock()
	if g.released {
		return
	}
	g.abort(err.Error())
}

func (g *Group) abort(reason string) {
	if !atomic.CompareAndSwapUint32(g.u32(offAbortRank), 0, uint32(g.rank)+1) {
		return
	}
	if len(reason) > abortReasonMax {
		reason = reason[:abortReasonMax]
	}
	n := copy(g.mem[offAbortReason:offAbortReason+abortReasonMax], reason)
	atomic.StoreUint32(g.u32(offAbortLen), uint32(n))
	atomic.StoreUint32(g.u32(offAbort), 1)
	for r := range g.size {
		g.bell(r, rCommBell).kick()
	}
	g.barrierBell().kick()
}

// aborted returns the abort error once some rank has aborted the segment.
func (g *Group) aborted() error {
	if atomic.LoadUint32(g.u32(offAbort)) == 0 {
		return nil
	}
	if p := g.abortErr.Load(); p != nil {
		return *p
	}
	rank := int(atomic.LoadUint32(g.u32(offAbortRank))) - 1
	n := min(int(atomic.LoadUint32(g.u32(offAbortLen))), abortReasonMax)
	err := fmt.Errorf("%w by local rank %d: %s", ErrAborted, rank, g.mem[offAbortReason:offAbortReason+n])
	g.abortErr.Store(&err)
	return err
}

// Close closes the Comm and the Messenger and unmaps the segment. Slots returned by Slot must not
// be used afterwards.
func (g *Group) Close() error {
	g.closeHalf(stateCommClosed)
	g.closeHalf(stateMsgClosed)
	return nil
}

// closeHalf closes the Comm (stateCommClosed) or the Messenger (stateMsgClosed): it tells the peers
// through the state word, wakes everything that may sleep on this half (peers and this process),
// and unmaps the segment once both halves are closed.
func (g *Group) closeHalf(bit uint32) {
	g.closeMu.Lock()
	defer g.closeMu.Unlock()
	local := &g.commClosed
	if bit == stateMsgClosed {
		local = &g.msgClosed
	}
	if local.Swap(true) {
		return
	}
	if bit == stateMsgClosed {
		g.msgr.beginStop()
	}
	g.mu.RLock()
	atomic.OrUint32(g.u32(g.lay.rankBlock(g.rank)+rState), bit)
	for r := range g.size {
		if bit == stateCommClosed {
			g.bell(r, rCommBell).kick()
		} else {
			g.bell(r, rMsgBell).kick()
			g.bell(r, rMsgSpaceBell).kick()
		}
	}
	if bit == stateCommClosed {
		g.barrierBell().kick()
	}
	g.mu.RUnlock()
	if bit == stateMsgClosed {
		g.msgr.endStop()
	}
	if g.commClosed.Load() && g.msgClosed.Load() {
		g.mu.Lock()
		if !g.released {
			g.released = true
			if err := syscall.Munmap(g.mem); err != nil {
				slog.Warn("shm: unmap segment", "path", g.path, "err", err)
			}
			g.mem = nil
			syscall.Close(g.fd)
		}
		g.mu.Unlock()
	}
}

// peerGone returns a *transport.PeerError when peer has closed the half of the transport given by
// closedBit or, if procs, when its process has exited; nil while it looks alive.
func (g *Group) peerGone(peer int, op string, closedBit uint32, procs bool) error {
	if atomic.LoadUint32(g.u32(g.lay.rankBlock(peer)+rState))&closedBit != 0 {
		return &transport.PeerError{Rank: peer, Op: op, Err: errPeerClosed}
	}
	if procs && g.procs[peer] {
		if err := processGone(g.pids[peer], g.starts[peer]); err != nil {
			return &transport.PeerError{Rank: peer, Op: op, Err: err}
		}
	}
	return nil
}

func (g *Group) bell(r int, field int64) doorbell {
	off := g.lay.rankBlock(r) + field
	return doorbell{word: g.u32(off), waiters: g.u32(off + cacheLine)}
}

func (g *Group) barrierBell() doorbell {
	return doorbell{word: g.u32(offBarGen), waiters: g.u32(offBarWaiters)}
}

func (g *Group) u32(off int64) *uint32 { return u32(g.mem, off) }
func (g *Group) u64(off int64) *uint64 { return u64(g.mem, off) }

func u32(mem []byte, off int64) *uint32 { return (*uint32)(unsafe.Pointer(&mem[off])) }
func u64(mem []byte, off int64) *uint64 { return (*uint64)(unsafe.Pointer(&mem[off])) }

// waiter carries one operation's waiting state across its retries: spin first, then sleep on a
// doorbell, checking on each wake-up the local close, the abort word, the context, the peers and,
// for a Comm call, the progress deadline.
type waiter struct {
	g       *Group
	ctx     context.Context
	bell    doorbell
	closed  *atomic.Bool
	abort   bool // whether the abort word ends this wait (Comm: yes, Messenger: no)
	spun    bool
	checked time.Time   // when peers' processes were last checked; zero before the first sleep
	stop    func() bool // unregisters the context's wake-up

	// The progress deadline: the call fails with errNoProgress once its waits have seen no
	// progress for the clock's limit (0: never). Progress is noted by a flag, and the clock is
	// read only by check, which runs when a wait did not end by spinning: the hot path pays
	// nothing for it.
	clock progressClock
	moved bool // the call moved data (or, for a Barrier, ranks arrived) since the last check
}

// progressClock is one call's progress deadline, told of each check of its waits (at most
// checkEvery apart while the process runs) and of whether the call made progress since the last.
type progressClock struct {
	limit time.Duration // 0: no deadline
	since time.Time     // when the call last made progress, as the checks saw it; zero before
	last  time.Time     // the previous check
}

// expired notes a check at now, after progress if moved, and reports whether the call has gone
// limit without progress. A check frozenGap or more after the previous one means that this
// process did not run in between: the clock starts again rather than blame the peers for it.
func (c *progressClock) expired(now time.Time, moved bool) bool {
	if c.limit <= 0 {
		return false
	}
	if moved || c.since.IsZero() || now.Sub(c.last) >= frozenGap {
		c.since = now
	}
	c.last = now
	return now.Sub(c.since) >= c.limit
}

func (g *Group) newWaiter(ctx context.Context, bell doorbell, closed *atomic.Bool, abort bool) waiter {
	return waiter{g: g, ctx: ctx, bell: bell, closed: closed, abort: abort}
}

// progressed resets the spin after the operation moved data, so the next wait spins again, and
// restarts its progress clock.
func (w *waiter) progressed() {
	w.spun = false
	w.moved = true
}

// done releases the context registration; call it when the operation ends.
func (w *waiter) done() {
	if w.stop != nil {
		w.stop()
	}
}

// wait returns once ready() may hold, or with an error: ErrClosed, the abort error, the context's
// error, or the peers' error from gone(procs) (which is only believed while ready() is false,
// since a peer may write its last bytes and then close).
func (w *waiter) wait(ready func() bool, gone func(procs bool) error) error {
	if !w.spun {
		w.spun = true
		if spinUntil(ready, w.g.spin(), w.g.cfg.Yields) {
			return nil
		}
	}
	if err := w.check(ready, gone); err != nil {
		return err
	}
	if w.stop == nil && w.ctx.Done() != nil {
		g, bell := w.g, w.bell
		w.stop = context.AfterFunc(w.ctx, func() {
			// The operation may have ended and the segment been unmapped since: a Close in
			// progress holds the lock and wakes every sleeper itself.
			if g.mu.TryRLock() {
				if !g.released {
					bell.kick()
				}
				g.mu.RUnlock()
			}
		})
	}
	// Also wake for a close, an abort or the context, in case their doorbell kick came between
	// check and sleep (sleep reads the doorbell before it evaluates this).
	done := w.ctx.Done()
	w.bell.sleep(func() bool {
		if ready() || w.closed.Load() || (w.abort && atomic.LoadUint32(w.g.u32(offAbort)) != 0) {
			return true
		}
		select {
		case <-done:
			return true
		default:
			return false
		}
	}, checkEvery)
	return w.check(ready, gone)
}

func (w *waiter) check(ready func() bool, gone func(procs bool) error) error {
	if w.closed.Load() {
		return transport.ErrClosed
	}
	if w.abort {
		if err := w.g.aborted(); err != nil && !ready() {
			return err
		}
	}
	if err := w.ctx.Err(); err != nil {
		return context.Cause(w.ctx)
	}
	now := time.Now()
	if w.checked.IsZero() {
		w.checked = now
	}
	procs := now.Sub(w.checked) >= checkEvery
	if procs {
		w.checked = now
	}
	if err := gone(procs); err != nil && !ready() {
		return err
	}
	moved := w.moved
	w.moved = false
	if w.clock.expired(now, moved) && !ready() {
		return errNoProgress
	}
	return nil
}

// spin is how long this rank's waits poll before they sleep now (<= 0: never).
func (g *Group) spin() time.Duration { return time.Duration(g.spinNs.Load()) }
