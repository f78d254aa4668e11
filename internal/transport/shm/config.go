// Package shm is the transport among the ranks of one host: one shared-memory segment per host,
// created once for the job by local rank 0 and mapped by every local rank. It provides a
// transport.Comm (with the transport.Shared capability: per-rank slots and a barrier) and a
// transport.Messenger, built from single-producer single-consumer byte rings, atomics on the
// mapping and futex waits.
//
// The segment's memory is reserved (fallocate) before any page of it is touched, because a page
// fault on a full tmpfs is a SIGBUS that kills the process, where a failed fallocate is an error
// that can say what to change. The header, ring controls and slots are reserved by rank 0 at Open
// and pre-faulted by every rank then. The rings, one data ring and one message ring per ordered
// pair of local ranks, stay a hole in the file until first used: a ring's sender reserves and
// pre-faults it the first time it sends on it, before it writes a byte, and the receiver
// pre-faults it the first time it finds data in it (which the sender publishes only after it
// reserved the ring). So /dev/shm holds the rings the job's traffic uses (an allreduce: those to
// and from rank 0 and a few partners), not all n(n-1) pairs' (an alltoall still uses them all),
// and a ring that does not fit fails the Send that first needed it, naming the ring.
//
// Waits spin for a few microseconds and then sleep on a futex with a short timeout, checking on
// every wake-up the caller's context, an abort word in the segment, and whether the peer process is
// still alive, so a killed rank makes its peers fail within a fraction of a second rather than hang;
// a live peer that moves nothing fails a Comm call after the progress timeout (Config.ProgressTimeout).
//
// This package must not know about tensors, ops or the engine, and must not talk to other hosts:
// it moves bytes between local ranks and says which one failed. The segment file is unlinked as
// soon as every rank has attached, so a crash never leaks /dev/shm space.
package shm

import (
	"fmt"
	"strings"
	"time"

	"github.com/kolo-dl/kolo/internal/spin"
	"github.com/kolo-dl/kolo/internal/transport"
)

// Config describes one host's segment. Every local rank must pass the same Name, Size and sizes.
type Config struct {
	// Name is the segment file's name under Dir, unique per job and host, e.g. "kolo-<jobid>-<host>".
	Name string
	// Rank is this process's local rank in [0, Size); Size is the number of ranks on this host.
	Rank, Size int
	// SlotBytes is the size of each rank's transport.Shared slot, rounded up to 4 KiB. Default:
	// 8 MiB up to 24 local ranks, then slotBudget shared among the ranks (at least 2 MiB each).
	SlotBytes int
	// RingBytes is the size of the stream ring of each ordered pair for Send/Recv, rounded up to
	// 4 KiB, at least transport.MinBuffered. Default: 1 MiB up to 8 local ranks, then ringBudget
	// shared among the pairs (down to transport.MinBuffered).
	RingBytes int
	// MsgRingBytes is the size of the Messenger ring of each ordered pair (at least 4 KiB). Longer
	// messages are streamed through it in pieces. Default: 64 KiB up to 12 local ranks, then
	// msgRingBudget shared among the pairs (down to 8 KiB).
	MsgRingBytes int
	// Timeout bounds Open: how long rank 0 waits for the others to attach and they wait for the
	// segment to appear (default 30 s).
	Timeout time.Duration
	// Dir holds the segment file (default /dev/shm).
	Dir string
	// Spin is how long a wait spins before it sleeps on a futex (negative: never spin). The default
	// follows the rule the engine's driver follows too (internal/spin's Defaults, which has the
	// measurements): 50 µs when the host has a CPU for every local rank and no spinning otherwise,
	// since spinning buys latency only while the peer runs at the same time; with more ranks than
	// cores it burns the time the peer needs (on the 2-core VM, 8 ranks' Barrier took twice as long
	// with it).
	Spin time.Duration
	// Yields is how many times a wait that does not spin yields its CPU (sched_yield) before it
	// sleeps. Left 0 with the default Spin on a host whose ranks outnumber its CPUs, it is the
	// shared rule's count (spin.DefaultYields); an explicit negative Spin keeps it 0, for callers
	// that want no polling at all.
	Yields int
	// ProgressTimeout fails a Comm call (Send, Recv, SendRecv, Barrier) that waited this long on
	// a peer that moved no byte (a Barrier: on ranks that did not arrive) with a
	// *transport.StallError; 0 means transport.DefaultProgressTimeout, negative never. Only time
	// this process runs counts: a wait that finds its own process was not running for a while (it
	// was stopped itself) starts its clock again.
	ProgressTimeout time.Duration
	// Host names this host in errors; Ranks[r], when given, is local rank r's rank in the job, by
	// which a *transport.StallError names the peer it waited on (other errors name local ranks).
	Host  string
	Ranks []int
}

const (
	defaultSlotBytes    = 8 << 20
	defaultRingBytes    = 1 << 20
	defaultMsgRingBytes = 64 << 10
	defaultTimeout      = 30 * time.Second
	defaultDir          = "/dev/shm"
	pageBytes           = 4096
	minMsgRingBytes     = pageBytes
	maxRanks            = 4096

	// The defaults' budgets. The slots, one per rank, carry the shared-memory collectives; the
	// rings, one per ordered pair, carry Send/Recv (recursive doubling, small broadcasts, what
	// two ranks or a process set within a host exchange) and the control messages. At the full sizes the pairs make the segment grow as n² (64
	// ranks: 4.7 GiB), so past a few ranks each kind shares a fixed budget: the segment is then
	// n slots plus budgets, 476 MiB at 64 ranks, until the rings reach their floors
	// (transport.MinBuffered and 8 KiB, so 72 KiB a pair) past about 34 ranks for the data
	// rings, whose n² term then dominates again (128 ranks: 1.4 GiB). These sizes are the
	// worst case, every ring used (an alltoall of a process set of most of a host's ranks); a ring
	// is reserved only at its first use, so a job whose ranks talk to few peers holds the slots
	// and those few rings.
	slotBudget    = 192 << 20
	minSlotBytes  = 2 << 20
	ringBudget    = 64 << 20
	msgRingBudget = 8 << 20
	// defaultMsgRingFloor keeps a few dozen negotiation responses per peer: a rank busy outside
	// kolo reads its messages only when it next submits, and the coordinator's send to it waits
	// for room meanwhile.
	defaultMsgRingFloor = 8 << 10
)

// shareOf is full while n items of that size fit budget, else budget/n rounded down to pages,
// never below floor.
func shareOf(full, budget, floor, n int) int {
	if n <= 0 || n*full <= budget {
		return full
	}
	return max(budget/n/pageBytes*pageBytes, floor)
}

// ErrAborted is matched (errors.Is) by every error caused by some rank calling Group.Abort.
var ErrAborted = transport.ErrAborted

// normalize fills defaults and checks cfg; every rank computes the same layout from the same config.
func (cfg Config) normalize() (Config, error) {
	if cfg.Name == "" || strings.ContainsRune(cfg.Name, '/') || cfg.Name == "." || cfg.Name == ".." {
		return cfg, fmt.Errorf("shm: segment name %q must be a non-empty file name without '/'", cfg.Name)
	}
	if cfg.Size < 1 || cfg.Size > maxRanks {
		return cfg, fmt.Errorf("shm: segment %q: size %d out of range [1, %d]", cfg.Name, cfg.Size, maxRanks)
	}
	if cfg.Rank < 0 || cfg.Rank >= cfg.Size {
		return cfg, fmt.Errorf("shm: segment %q: rank %d out of range [0, %d)", cfg.Name, cfg.Rank, cfg.Size)
	}
	if cfg.SlotBytes < 0 || cfg.RingBytes < 0 || cfg.MsgRingBytes < 0 {
		return cfg, fmt.Errorf("shm: segment %q: negative size (slot %d, ring %d, msg ring %d)",
			cfg.Name, cfg.SlotBytes, cfg.RingBytes, cfg.MsgRingBytes)
	}
	pairs := cfg.Size * (cfg.Size - 1)
	if cfg.SlotBytes == 0 {
		cfg.SlotBytes = shareOf(defaultSlotBytes, slotBudget, minSlotBytes, cfg.Size)
	}
	if cfg.RingBytes == 0 {
		cfg.RingBytes = shareOf(defaultRingBytes, ringBudget, transport.MinBuffered, pairs)
	}
	if cfg.MsgRingBytes == 0 {
		cfg.MsgRingBytes = shareOf(defaultMsgRingBytes, msgRingBudget, defaultMsgRingFloor, pairs)
	}
	cfg.SlotBytes = roundUp(cfg.SlotBytes, pageBytes)
	cfg.RingBytes = roundUp(max(cfg.RingBytes, transport.MinBuffered), pageBytes)
	cfg.MsgRingBytes = roundUp(max(cfg.MsgRingBytes, minMsgRingBytes), pageBytes)
	if cfg.Timeout <= 0 {
		cfg.Timeout = defaultTimeout
	}
	if cfg.Dir == "" {
		cfg.Dir = defaultDir
	}
	if cfg.ProgressTimeout == 0 {
		cfg.ProgressTimeout = transport.DefaultProgressTimeout
	}
	if cfg.ProgressTimeout < 0 {
		cfg.ProgressTimeout = 0 // never
	}
	if cfg.Ranks != nil && len(cfg.Ranks) != cfg.Size {
		return cfg, fmt.Errorf("shm: segment %q: %d job ranks given for %d local ranks", cfg.Name, len(cfg.Ranks), cfg.Size)
	}
	if cfg.Spin == 0 {
		d, yields := spin.Defaults(cfg.Size)
		cfg.Spin = d
		if d == 0 {
			cfg.Spin = -1 // 0 would mean "the default" again
			if cfg.Yields == 0 {
				cfg.Yields = yields
			}
		}
	}
	return cfg, nil
}

func roundUp(n, to int) int { return (n + to - 1) / to * to }

// SegmentBytes is the size of the segment Open will create for cfg (after defaults): the most of
// /dev/shm it can take, once every ring has been used. Open reserves only ReservedBytes of it; the
// rest is reserved ring by ring as ranks first send to each other. It returns 0 for a config Open
// would reject.
func SegmentBytes(cfg Config) int64 {
	n, err := cfg.normalize()
	if err != nil {
		return 0
	}
	return newLayout(n).total
}

// ReservedBytes is the part of the segment Open reserves up front (header, ring controls and
// slots), so a caller can compare it with the free space of /dev/shm first (containers default to
// 64 MiB) and say what to change; SegmentBytes minus ReservedBytes is the most the rings can add
// later. It returns 0 for a config Open would reject.
func ReservedBytes(cfg Config) int64 {
	n, err := cfg.normalize()
	if err != nil {
		return 0
	}
	return newLayout(n).reserved()
}

// Segment layout. Everything is at a fixed offset computed from the config, so no offsets are
// stored; the header records the sizes and every rank checks them against its own config.
//
//	global header (one page): identity, ready word, attach count, abort word and reason, barrier
//	per-rank blocks (rankBlockBytes each): pid, state, barrier arrivals, futex doorbells
//	ring controls (ringCtlBytes each): tail and head, on separate cache lines; data rings, then msg rings
//	slots, data rings, msg rings: each page-aligned; the rings come last, so that what is
//	reserved at create is one prefix of the file and the rings a hole after it until first used
const (
	cacheLine = 64

	// global header fields
	offMagic        = 0
	offVersion      = 8
	offSize         = 12
	offSlotBytes    = 16
	offRingBytes    = 24
	offMsgRingBytes = 32
	offTotal        = 40
	offCreatorPid   = 48
	offCreatorStart = 56
	offReady        = 1 * cacheLine
	offCreatorPidNS = offReady + 8  // pid namespace of the creator: its pid means nothing in another
	offHostCPUs     = offReady + 16 // uint32: CPUs the creator could run on, so every rank judges oversubscription alike
	offAttached     = 2 * cacheLine
	offAbort        = 3 * cacheLine // uint32: 0, or 1 once the reason is written
	offAbortRank    = offAbort + 4  // uint32: aborting rank + 1 (claimed by CAS before the reason is written)
	offAbortLen     = offAbort + 8  // uint32
	offAbortReason  = 4 * cacheLine
	abortReasonMax  = 4 * cacheLine
	offBarArrivals  = 8 * cacheLine  // uint64: total Barrier arrivals of all ranks
	offBarGen       = 9 * cacheLine  // uint32 futex word, bumped when a barrier completes
	offBarWaiters   = 10 * cacheLine // uint32: ranks asleep on offBarGen
	globalBytes     = pageBytes

	// per-rank block fields
	rankBlockBytes    = 8 * cacheLine
	rPid              = 0
	rStart            = 8  // process start time in clock ticks since boot, to tell a reused pid
	rState            = 16 // uint32 bits, see state*
	rPidNS            = 24 // pid namespace inode: a peer in another namespace cannot be checked by pid
	rBarArrived       = 1 * cacheLine
	rCommBell         = 2 * cacheLine // futex word the rank's Comm calls sleep on
	rCommWaiters      = 3 * cacheLine
	rMsgBell          = 4 * cacheLine // futex word the rank's Messenger reader sleeps on
	rMsgWaiters       = 5 * cacheLine
	rMsgSpaceBell     = 6 * cacheLine // futex word the rank's SendMsg calls sleep on for ring space
	rMsgSpaceWaiters  = 7 * cacheLine
	ringCtlBytes      = 2 * cacheLine
	ctlTail           = 0
	ctlHead           = cacheLine
	segmentMagic      = 0x314d48534f4c4f4b // "KOLOSHM1" little-endian
	segmentVersion    = 4
	stateAttached     = 1
	stateCommClosed   = 2
	stateMsgClosed    = 4
	headerReadyMarker = 1
)

type layout struct {
	size, pairs                          int
	slotBytes, ringBytes, msgRingBytes   int
	rankBlocks, ringCtls, msgCtls        int
	slots, rings, msgRings, total, hdrSz int64
}

func newLayout(cfg Config) layout {
	l := layout{size: cfg.Size, pairs: cfg.Size * (cfg.Size - 1),
		slotBytes: cfg.SlotBytes, ringBytes: cfg.RingBytes, msgRingBytes: cfg.MsgRingBytes}
	l.rankBlocks = globalBytes
	l.ringCtls = l.rankBlocks + l.size*rankBlockBytes
	l.msgCtls = l.ringCtls + l.pairs*ringCtlBytes
	l.hdrSz = int64(roundUp(l.msgCtls+l.pairs*ringCtlBytes, pageBytes))
	l.slots = l.hdrSz
	l.rings = l.slots + int64(l.size)*int64(l.slotBytes)
	l.msgRings = l.rings + int64(l.pairs)*int64(l.ringBytes)
	l.total = l.msgRings + int64(l.pairs)*int64(l.msgRingBytes)
	return l
}

// pair numbers the ordered pair src->dst (src != dst) densely: no ring from a rank to itself.
func (l layout) pair(src, dst int) int {
	if dst > src {
		dst--
	}
	return src*(l.size-1) + dst
}

// reserved is the prefix of the segment reserved at create: everything before the rings.
func (l layout) reserved() int64 { return l.rings }

func (l layout) rankBlock(r int) int64 { return int64(l.rankBlocks + r*rankBlockBytes) }
func (l layout) ringCtl(src, dst int) int64 {
	return int64(l.ringCtls + l.pair(src, dst)*ringCtlBytes)
}
func (l layout) msgCtl(src, dst int) int64 { return int64(l.msgCtls + l.pair(src, dst)*ringCtlBytes) }
func (l layout) slot(r int) int64          { return l.slots + int64(r)*int64(l.slotBytes) }
func (l layout) ring(src, dst int) int64 {
	return l.rings + int64(l.pair(src, dst))*int64(l.ringBytes)
}
func (l layout) msgRing(src, dst int) int64 {
	return l.msgRings + int64(l.pair(src, dst))*int64(l.msgRingBytes)
}
