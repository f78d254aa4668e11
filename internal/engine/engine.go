// Package engine is kolo's background loop: it takes ops that user threads submit by name, has the
// coordinator (rank 0) match them across ranks, fuses ready tensors into one buffer, runs the
// collectives and completes the handles.
//
// The loop runs wherever it costs least (drive.go): in the caller blocked in Handle.Wait, which
// then needs no hand-off from another goroutine to learn that its op is done, or in a background
// goroutine for ops nobody waits on yet. The matching logic itself is the pure state machine in
// internal/engine/negotiate; this package feeds it (requests in, responses out), moves its messages and acts
// on what it decides. It must not implement collective algorithms (package collective) or move
// bytes itself (package transport).
//
// Process sets (processsets.go) are subsets of ranks that run ops among themselves; each has its
// own negotiation (a Coordinator of the Hub on rank 0) and executes over a transport.Sub of the
// job's Comm. The global set, id 0, is every rank.
//
// Ops on tensors in GPU memory (device.go) are negotiated as every other op; their responses run
// on the device executor (device_execute.go), which enqueues a gpu.Comm's collectives on the
// engine's own stream instead of moving host bytes.
package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kolo-dl/kolo/internal/engine/negotiate"
	"github.com/kolo-dl/kolo/internal/observe/flight"
	"github.com/kolo-dl/kolo/internal/timeline"
	"github.com/kolo-dl/kolo/internal/transport"
)

// Group is the set of connected ranks the engine runs on (world.World provides it).
type Group struct {
	Rank, Size int
	Hosts      []string            // Hosts[r], for error messages
	Comm       transport.Comm      // all ranks
	Messenger  transport.Messenger // all ranks
	Local      transport.Comm      // ranks of this host (may be Shared)
	LocalRanks []int               // job ranks of Local
	Cross      transport.Comm      // same local rank across hosts; nil if not homogeneous
	Abort      func(error)         // make every local wait fail (shared memory); may be nil
	// Stopped, if set, is called once when the engine stops on an error, with that error, before
	// any op fails with it: a program that leaves on the op's error has had it reported (the
	// worker sends the launcher its failure record). It must return within a few seconds.
	Stopped func(error)
	// PeersEnded, if set, is called when an op fails because ranks ended (reached shutdown) without
	// submitting it (an OpError with Ended), with that error, before the op's handles finish: the
	// engine goes on, but those ranks are gone, and a program that leaves on the error has had it
	// reported, as with Stopped. It must return within a few seconds.
	PeersEnded func(*OpError)
}

// ErrShutdown is returned for ops submitted after Shutdown or pending when it ran.
var ErrShutdown = errors.New("kolo engine has been shut down")

// ErrDuplicateName is matched (errors.Is) by the error of an op submitted under a name that an op
// of the same process set submitted on this rank still holds (it has not completed).
var ErrDuplicateName = errors.New("duplicate name")

// ArgumentError is an op this rank refused before negotiation: its arguments are wrong on this
// rank (a tensor that does not match its shape, splits that do not add up, a root outside the
// set, a name still in flight). The op never ran here. Unless the op could not be told to the
// coordinator (a duplicate name, a process set this rank is not in), the other ranks' submissions
// of it fail too, with this error's text (negotiate.Request.Error), rather than wait for this rank.
// The Python binding raises ValueError for it, as Horovod does for invalid arguments.
type ArgumentError struct{ Err error }

func (e *ArgumentError) Error() string { return e.Err.Error() }
func (e *ArgumentError) Unwrap() error { return e.Err }

// Engine is one rank's loop.
type Engine struct {
	cfg Config
	g   Group

	// sent counts the ops this rank submitted to the coordinator, sentIDs those of them it sent
	// as response-cache ids (Requests).
	sent, sentIDs atomic.Uint64

	mu      sync.Mutex
	queue   []*entry
	closed  bool
	fatal   error
	driving bool // someone holds the drive token, and will take what is queued
	kicking bool // kick is armed
	handoff bool // the last driver left work to callers waiting to drive (see release)

	drive   chan struct{} // the drive token: sending takes it, receiving gives it back
	summon  chan struct{} // asks the background goroutine to drive
	nudge   chan struct{} // wakes a driver asleep on the inbox channel (no Poller)
	kick    *time.Timer   // summons the background goroutine for queued ops nobody picked up
	waiting atomic.Int32  // callers in Handle.Wait, ready to drive: the background goroutine gives way
	queued  atomic.Int32  // len(queue), for a sleeping driver's wake-up condition
	stopped chan struct{} // closed when the background goroutine exits

	poller  transport.Poller     // the Messenger's Poller capability, if it has one
	inbox   <-chan transport.Msg // else its Inbox
	timer   *time.Timer          // bounds a driver's sleep on inbox (driver-owned)
	held    transport.Msg        // a message taken from inbox while sleeping, not yet handled (a value: no allocation per wake)
	hasHeld bool                 // held is set
	heldOK  bool                 // held came from an open inbox

	// bgDriving: the background goroutine holds the drive token, and a caller that starts waiting
	// must wake it to take over.
	bgDriving atomic.Bool
	// told: an Abort that could not take the drive token is telling, or has told, the peers why
	// this rank stops, so that fail does not tell them again (under mu). toldDone is closed once
	// it has: the engine finishes no handle before, as when fail tells them itself.
	told     bool
	toldDone chan struct{}
	// aborted is that Abort's error: the driver stops the engine with it at its next step.
	aborted atomic.Pointer[error]
	// lastOpErr is the last op error handed to a caller while the job goes on: what a program
	// that leaves on it left on (LastOpError).
	lastOpErr atomic.Pointer[OpError]
	// tl is the running timeline, or nil: the only cost of a disabled timeline is loading it.
	// tlMu orders StartTimeline and StopTimeline (the loop only loads tl).
	tl   atomic.Pointer[timeline.Timeline]
	obs  *observer // flight recorder, meter and (rank 0) straggler tracker: observe.go
	tlMu sync.Mutex

	// inFlight holds, per process set, the names of the ops submitted on this rank that have not
	// completed, and the handle of the op that holds each (under namesMu, which is taken after mu,
	// never before).
	namesMu  sync.Mutex
	inFlight map[setName]*Handle
	resync   map[int]resyncPoint // per process set: the last Response.Resync (under namesMu)
	// joins counts the completed joins (every rank joined): the API layer restarts its numbering
	// of unnamed ops there, where every rank agrees on it again.
	joins atomic.Uint64

	// sets are the process sets by id, the global one (0) included. Only the driver changes the
	// map, under mu; Enqueue reads it under mu.
	sets     map[int]*procSet
	global   *procSet
	setCalls int // AddProcessSet and RemoveProcessSet calls on this rank, which name them (under mu)

	// Driver-owned state: only the holder of the drive token touches these.
	inflight int    // ops submitted on this rank and not yet executed, over every set
	joining  *entry // this rank's Join, until every rank has joined
	hub      *negotiate.Hub
	table    *negotiate.SetTable
	foreign  int // (rank 0) process sets without rank 0, whose messages it must read all the time
	// Reused every cycle, so that the loop allocates nothing of its own in steady state (see
	// TestDrainQueueAllocatesNothing): the queue slice drainQueue took last (Enqueue appends to
	// it next), the per-set request lists, the Batch and its encoding.
	spare  []*entry
	outs   []outgoing
	batch  negotiate.Batch
	msgBuf []byte
	// leaving is set once the shutdown barrier has been negotiated: every rank has reached
	// Shutdown, so a peer closing its connections from then on is expected, not a failure.
	leaving  bool
	ended    bool      // the loop has stopped for good (failure, or shut down)
	nextTick time.Time // when the coordinator's stall inspector runs next

	// tune holds the settings the autotuner changes while the job runs (autotune.go).
	tune tuning

	// The driver's control sends and their watchdog (sendControl, watchSends): sendCtx is
	// cancelled when a send waited the progress timeout; sendSince is when the send in progress
	// began (unix nanoseconds; 0: none). Nil sendCtx: no progress timeout.
	sendCtx      context.Context
	sendCancel   context.CancelCauseFunc // under sendCancelMu: the driver replaces it
	sendCancelMu sync.Mutex
	sendSince    atomic.Int64

	// The coordinator's keep-alive (keepalive.go). On rank 0: kaDue asks the driver for a round,
	// executing tells the keepAlive goroutine that the driver is inside a collective, kaWaiting
	// is the driver's scratch for Hub.Waiting and kaMsg the message. Elsewhere: coord, the
	// driver's deadline on rank 0.
	kaDue     atomic.Bool
	executing atomic.Bool
	kaWaiting []bool
	kaMsg     []byte
	coord     coordClock
	// members is rank 0's deadline on the others, fed by their heartbeats (keepalive.go).
	members memberClock

	dev *devicePath // the device path (device.go)
}

// setName is an op's name within its process set.
type setName struct {
	set  int
	name string
}

// reserve records that h, an op of set, holds name until it completes; false if another op does.
// A name that only a refusal holds (an op this rank refused, whose error the coordinator has not
// answered yet) passes to h: the op's caller has its error already, and to it the name is free.
// h then waits behind the refusal (see drainQueue) rather than fail as a duplicate on this rank
// alone, which would leave the other ranks' submissions of it waiting for this rank.
func (e *Engine) reserve(set int, name string, h *Handle) bool {
	k := setName{set, name}
	e.namesMu.Lock()
	defer e.namesMu.Unlock()
	if holder := e.inFlight[k]; holder != nil && !holder.refusal {
		return false
	}
	e.inFlight[k] = h
	return true
}

// unreserve frees name in set if h still holds it.
func (e *Engine) unreserve(set int, name string, h *Handle) {
	k := setName{set, name}
	e.namesMu.Lock()
	if e.inFlight[k] == h {
		delete(e.inFlight, k)
	}
	e.namesMu.Unlock()
}

// resyncPoint is a Response.Resync and the Joins count when it came.
type resyncPoint struct{ count, joins uint64 }

// Resynced is, for process set set, the count of unnamed ops that the last failure of calls that
// went different ways set (negotiate.Response.Resync), and the Joins count then; 0, 0 if none. The
// API layer numbers its next unnamed ops of the set from there, where every rank agrees again.
func (e *Engine) Resynced(set int) (count, joins uint64) {
	e.namesMu.Lock()
	defer e.namesMu.Unlock()
	p := e.resync[set]
	return p.count, p.joins
}

// Joins is the number of joins that have completed on every rank (each time every rank called
// Join): a point in the op stream where every rank has submitted the same ops.
func (e *Engine) Joins() uint64 { return e.joins.Load() }

// entry is one op submitted on this rank.
type entry struct {
	req       negotiate.Request
	submitted time.Time // when the driver took it from the queue
	fid       flight.ID // its record in the flight recorder
	set       *procSet
	in        []byte       // input bytes
	out       []byte       // output bytes (nil when the engine allocates: allgather, alltoall, reducescatter)
	dev       *deviceEntry // an op on device memory (EnqueueDevice); nil: in, out are host memory
	h         *Handle
}

// outgoing is the requests of one process set going to the coordinator in one Batch.
type outgoing struct {
	ps   *procSet
	reqs []negotiate.Request
}

// New starts the engine on a connected group.
func New(cfg Config, g Group) (*Engine, error) {
	def := DefaultConfig()
	if cfg.FusionBytes == 0 {
		cfg.FusionBytes = def.FusionBytes
	}
	if cfg.StallWarning <= 0 {
		cfg.StallWarning = def.StallWarning
	}
	if cfg.StallShutdown == 0 {
		cfg.StallShutdown = def.StallShutdown
	}
	if cfg.StallCrossed == 0 {
		cfg.StallCrossed = def.StallCrossed
	}
	if cfg.ProgressTimeout == 0 {
		cfg.ProgressTimeout = def.ProgressTimeout
	}
	if cfg.ShutdownWait <= 0 {
		cfg.ShutdownWait = def.ShutdownWait
	}
	if cfg.Spin < 0 {
		cfg.Spin = 0 // unset: picking DefaultSpin for the host is kolo.Init's business
	}
	// Horovod's convention: a capacity of 0 disables the cache; negotiate wants a negative number.
	capacity := cfg.CacheCapacity
	if capacity <= 0 {
		capacity = -1
	}
	cache, err := negotiate.NewCache(g.Rank, g.Size, capacity)
	if err != nil {
		return nil, err
	}
	all := make([]int, g.Size)
	for i := range all {
		all[i] = i
	}
	global := &procSet{id: 0, ranks: all, rank: g.Rank, cache: cache, exec: newExecutor(g, cfg),
		pending: map[string]*entry{}, behind: map[string][]*entry{}}
	e := &Engine{
		cfg:      cfg,
		g:        g,
		drive:    make(chan struct{}, 1),
		summon:   make(chan struct{}, 1),
		nudge:    make(chan struct{}, 1),
		kick:     time.NewTimer(time.Hour),
		timer:    time.NewTimer(time.Hour),
		stopped:  make(chan struct{}),
		toldDone: make(chan struct{}),
		sets:     map[int]*procSet{0: global},
		inFlight: map[setName]*Handle{},
		resync:   map[int]resyncPoint{},
		global:   global,
		table:    negotiate.NewSetTable(g.Size),
		dev:      newDevicePath(),
	}
	e.kick.Stop()
	e.timer.Stop()
	if e.obs, err = newObserver(g.Rank, g.Size, time.Now()); err != nil {
		return nil, err
	}
	if p, ok := transport.PollerOf(g.Messenger); ok {
		e.poller = p
	} else {
		e.inbox = g.Messenger.Inbox()
	}
	if g.Rank == 0 {
		e.hub, err = negotiate.NewHub(negotiate.Config{
			Size:          g.Size,
			FusionBytes:   cfg.FusionBytes,
			CacheCapacity: capacity,
			StallWarning:  stallWarning(cfg),
			StallShutdown: stallDeadline(cfg, cfg.StallShutdown),
			StallCrossed:  stallDeadline(cfg, cfg.StallCrossed),
		})
		if err != nil {
			return nil, err
		}
		if tickEvery(cfg) > 0 {
			e.nextTick = time.Now().Add(tickEvery(cfg))
		}
		if cfg.SmallAllreduceBytes != 0 || cfg.SharedRoundBytes != 0 || len(g.LocalRanks) < g.Size {
			// Rank 0's values, ahead of every op: a rank started with other ones (another
			// environment under mpirun) must not run other algorithms than the rest. Across
			// hosts always, for the hierarchical allreduce (HOROVOD_HIERARCHICAL_ALLREDUCE).
			e.hub.Retune(negotiate.Collectives{SmallAllreduceBytes: cfg.SmallAllreduceBytes,
				SharedRoundBytes: cfg.SharedRoundBytes, Hierarchical: cfg.Hierarchical})
		}
	}
	if cfg.Timeline != "" {
		if err := e.StartTimeline(cfg.Timeline, cfg.TimelineMarkCycles); err != nil {
			return nil, err
		}
	}
	if err := e.initTuning(cfg); err != nil {
		return nil, err
	}
	if cfg.ProgressTimeout > 0 && g.Size > 1 {
		e.sendCtx, e.sendCancel = context.WithCancelCause(context.Background())
		go e.watchSends()
	}
	// The driver reads the keep-alive state (watchMembers): it is set before any goroutine starts.
	keepAlive, heartbeat := e.keepAliveOn(), g.Size > 1 && cfg.ProgressTimeout > 0
	if keepAlive {
		e.kaWaiting = make([]bool, g.Size)
		e.members = memberClock{heard: make([]time.Time, g.Size), missing: make([]bool, g.Size)}
	}
	if keepAlive || heartbeat {
		e.kaMsg = negotiate.EncodeKeepAlive(nil)
	}
	go e.background()
	switch {
	case keepAlive:
		go e.keepAlive()
	case heartbeat:
		go e.heartbeat()
	}
	return e, nil
}

// stallWarning is the Coordinator's setting: negative disables the inspector.
func stallWarning(cfg Config) time.Duration {
	if !cfg.StallCheck || cfg.StallWarning <= 0 {
		return -1
	}
	return cfg.StallWarning
}

// stallDeadline is a stall deadline as the Coordinator takes it: 0 (never) when negative or when
// the inspector is off.
func stallDeadline(cfg Config, d time.Duration) time.Duration {
	if !cfg.StallCheck || d < 0 {
		return 0
	}
	return d
}

// tickEvery is how often the coordinator runs the stall inspector; 0 when it is off.
func tickEvery(cfg Config) time.Duration {
	every := time.Duration(0)
	// The progress deadline too: rank 0 watches at each tick that the ranks others wait on still
	// run (watchMembers).
	for _, d := range []time.Duration{stallWarning(cfg), stallDeadline(cfg, cfg.StallShutdown), stallDeadline(cfg, cfg.StallCrossed), cfg.ProgressTimeout} {
		if d > 0 && (every == 0 || d < every) {
			every = d
		}
	}
	if every == 0 {
		return 0
	}
	// At least every SetMismatchGrace, so that ops submitted in different process sets fail
	// within about twice that (Hub.Tick).
	return min(negotiate.SetMismatchGrace, every/4+time.Millisecond)
}

// Enqueue submits one op. in and out are the caller's buffers and must stay untouched until the
// handle completes. The handle fails at once if the op is malformed or the engine is down.
//
// req.Set picks the process set (0: every rank); this rank must be a member. A Broadcast's Root is
// a job rank, which must be a member too; Alltoall's Splits have one entry per member.
//
// Negotiation starts when someone drives the loop: the caller's Wait, another caller's, or the
// background goroutine, which takes ops nobody else picked up within kickDelay.
func (e *Engine) Enqueue(req negotiate.Request, in, out []byte) *Handle {
	return e.enqueueUser(req, in, out, true)
}

// EnqueueWaited is Enqueue for a caller that waits on the handle at once (the blocking calls): its
// Wait drives the loop, so the kick for ops nobody picks up is not armed. Arming and stopping a
// runtime timer per op wakes a thread of the Go runtime each time; with 32 ranks on 2 vCPUs that
// was a third of a 4-byte allreduce. Nothing is left undriven: a Wait takes a free token even when
// its context has ended and steps once, and whoever drives when it leaves takes what is queued.
func (e *Engine) EnqueueWaited(req negotiate.Request, in, out []byte) *Handle {
	return e.enqueueUser(req, in, out, false)
}

func (e *Engine) enqueueUser(req negotiate.Request, in, out []byte, kick bool) *Handle {
	if reservedName(req.Name) {
		h := newHandle(req.Name, e)
		h.finish(fmt.Errorf("%s %q: names starting with %q or %q are kolo's own", req.Kind, req.Name, setChangePrefix, deviceSetupName))
		return h
	}
	return e.enqueue(req, in, out, kick, nil)
}

// enqueue submits req. A request that is wrong on this rank (Request.Error set by the caller, or
// refused by admit or validate) fails the caller's handle at once with an ArgumentError and, where
// the coordinator can be told, still takes its turn as a refusal on a handle of the engine's own,
// so that the other ranks' submissions of it fail rather than wait for this rank.
//
// dv is the device side of an op on device memory (in and out are nil then).
func (e *Engine) enqueue(req negotiate.Request, in, out []byte, kick bool, dv *deviceEntry) *Handle {
	s := e.check(req, in, out, dv)
	if s.done {
		return s.caller
	}
	e.mu.Lock()
	e.appendLocked(&s)
	driving := e.kickLocked(kick)
	e.mu.Unlock()
	if driving {
		e.wakeDriver()
	}
	return s.caller
}

// EnqueueGroup submits the members of one grouped call as Enqueue would, all at once: no Batch
// to the coordinator holds some of them and not the others. The coordinator tells a grouped call
// of another length on another rank (a mismatch every member fails with) from members still to
// come only when each rank's members arrive together.
func (e *Engine) EnqueueGroup(reqs []negotiate.Request, ins, outs [][]byte) []*Handle {
	return e.enqueueGroup(reqs, ins, outs, nil)
}

// enqueueGroup queues a grouped call's members at once: host memory (ins, outs), or device
// memory (dvs; ins and outs nil).
func (e *Engine) enqueueGroup(reqs []negotiate.Request, ins, outs [][]byte, dvs []*deviceEntry) []*Handle {
	subs := make([]submission, len(reqs))
	for i, req := range reqs {
		if dvs != nil {
			subs[i] = e.check(req, nil, nil, dvs[i])
		} else {
			subs[i] = e.check(req, ins[i], outs[i], nil)
		}
	}
	e.mu.Lock()
	for i := range subs {
		if !subs[i].done {
			e.appendLocked(&subs[i])
		}
	}
	driving := e.kickLocked(true)
	e.mu.Unlock()
	if driving {
		e.wakeDriver()
	}
	hs := make([]*Handle, len(subs))
	for i := range subs {
		hs[i] = subs[i].caller
	}
	return hs
}

// submission is one op on its way into the queue: what check found, for appendLocked.
type submission struct {
	req     negotiate.Request
	ps      *procSet
	in, out []byte
	dv      *deviceEntry
	h       *Handle // the handle the queue entry completes
	caller  *Handle // the handle the caller gets
	refused error   // wrong on this rank: the caller's handle fails, the coordinator still hears of it
	done    bool    // caller has finished already: nothing to queue
}

// check runs the checks of enqueue that need no lock.
func (e *Engine) check(req negotiate.Request, in, out []byte, dv *deviceEntry) submission {
	h := newHandle(req.Name, e)
	s := submission{req: req, in: in, out: out, dv: dv, h: h, caller: h}
	s.ps = e.global
	if req.Set != 0 {
		e.mu.Lock()
		s.ps = e.sets[req.Set]
		e.mu.Unlock()
	}
	if err := e.admit(&s.req, s.ps); err != nil {
		// This rank has no say in that set: nobody to tell.
		h.finish(&ArgumentError{err})
		e.dev.drop(dv)
		s.done = true
		return s
	}
	req = s.req
	switch {
	case req.Error != "":
		s.refused = fmt.Errorf("rank %d: %s %q: %s", e.g.Rank, req.Kind, req.Name, req.Error)
	case dv == nil && e.deviceRuns(s.ps, req.GPU, req.Kind, req.DType, req.ReduceOp, req.PreScale, req.PostScale):
		// Every other rank runs it on the device path, which needs every rank's device pointers.
		// (A set without a device communicator stages its GPU ops on every rank: EnqueueDevice
		// refuses them there.)
		s.req.Error = "a GPU tensor staged through host memory where the device path serves it (submit it with EnqueueDevice)"
		s.refused = fmt.Errorf("rank %d: %s %q: %s", e.g.Rank, req.Kind, req.Name, s.req.Error)
	default:
		inLen, outLen := len(in), len(out)
		if dv != nil {
			inLen, outLen = dv.op.Bytes, dv.op.Bytes
		}
		if err := validate(req, inLen, outLen, len(s.ps.ranks)); err != nil {
			s.refused = fmt.Errorf("rank %d: %w", e.g.Rank, err)
			// The coordinator's error names the op already.
			s.req.Error = strings.TrimPrefix(err.Error(), fmt.Sprintf("%s %q: ", req.Kind, req.Name))
		}
	}
	return s
}

// appendLocked queues s, or finishes its caller's handle when the engine is down or the name is
// in flight. e.mu is held.
func (e *Engine) appendLocked(s *submission) {
	req, ps, h := s.req, s.ps, s.h
	fail := func(err error) {
		h.finish(err)
		e.dev.drop(s.dv)
		s.done = true
	}
	switch {
	case e.fatal != nil:
		fail(e.fatal)
		return
	case e.closed:
		fail(ErrShutdown)
		return
	}
	in, out, dv := s.in, s.out, s.dv
	if s.refused != nil {
		// The refusal holds the name until its error comes back from the coordinator (for the
		// op's turn there), under a handle of its own: the caller's fails now.
		h = newHandle(req.Name, e)
		h.refusal = true
	}
	if !e.reserve(ps.id, req.Name, h) {
		fail(&ArgumentError{fmt.Errorf("rank %d: %s %q%s: %w: an op of that name submitted on this rank has not completed; names must be unique among in-flight ops",
			e.g.Rank, req.Kind, req.Name, inSet(ps.id), ErrDuplicateName)})
		return
	}
	if s.refused != nil {
		s.caller.finish(&ArgumentError{s.refused})
		e.dev.drop(dv)
		in, out, dv = nil, nil, nil
	}
	h.reserved, h.set = true, ps.id
	e.queue = append(e.queue, &entry{req: req, set: ps, in: in, out: out, dev: dv, h: h})
	e.queued.Store(int32(len(e.queue)))
}

// kickLocked arms the kick for queued ops nobody drives (when kick is set), and reports whether a
// driver is running, to be woken once e.mu is released. e.mu is held.
func (e *Engine) kickLocked(kick bool) (driving bool) {
	driving = e.driving
	if kick && !driving && !e.kicking {
		e.kicking = true
		e.kick.Reset(kickDelay)
	}
	return driving
}

// Err returns the error that stopped the engine, if any.
func (e *Engine) Err() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.fatal
}

// drainQueue moves newly submitted ops into their sets' pending ops and tells the coordinator
// about them, one Batch per process set, in the order the sets first appear in the queue. It
// reports whether it took any, and returns ok == false when the loop must end.
func (e *Engine) drainQueue(now time.Time) (took, ok bool) {
	e.mu.Lock()
	q := e.queue
	if len(q) > 0 {
		// Enqueue appends to last cycle's slice from now on; q is this cycle's.
		e.queue, e.spare = e.spare, nil
		e.queued.Store(0)
	}
	closed := e.closed
	e.mu.Unlock()
	if len(q) > 0 {
		tl := e.tl.Load()
		outs := e.outs[:0]
		join := false
		for _, en := range q {
			ps := en.set
			en.submitted = now
			switch {
			case ps.removed:
				en.h.finish(fmt.Errorf("rank %d: %s %q: process set %d was removed before the op started", e.g.Rank, en.req.Kind, en.req.Name, ps.id))
				continue
			case en.req.Kind == negotiate.Join:
				if e.joining != nil {
					en.h.finish(fmt.Errorf("rank %d: join called again before the first join completed", e.g.Rank))
					continue
				}
				e.joining, join = en, true
				continue
			case e.joining != nil && ps == e.global:
				en.h.finish(fmt.Errorf("rank %d: %s %q submitted after this rank called join", e.g.Rank, en.req.Kind, en.req.Name))
				continue
			}
			if ps.pending[en.req.Name] != nil {
				// A refusal of this name is pending (see reserve): the coordinator would take this
				// op for it submitted twice. It goes once the refusal's answer is in (execute).
				ps.behind[en.req.Name] = append(ps.behind[en.req.Name], en)
				e.inflight++
				continue
			}
			// No other duplicate can reach here: enqueue reserved the name until the op completes.
			en.fid = e.obs.flight.Submit(now, en.req.Name, en.req.Kind.String(), en.req.DType.String(), en.inBytes(), ps.id)
			ps.pending[en.req.Name] = en
			e.inflight++
			if tl != nil {
				tl.Submitted(ps.id, en.req.Name, opLabel(en.req.Kind), e.g.Rank)
			}
			i := slices.IndexFunc(outs, func(o outgoing) bool { return o.ps == ps })
			if i < 0 {
				i = len(outs)
				outs = addOutgoing(outs, ps)
			}
			outs[i].reqs = append(outs[i].reqs, en.req)
		}
		if join && !slices.ContainsFunc(outs, func(o outgoing) bool { return o.ps == e.global }) {
			outs = addOutgoing(outs, e.global)
		}
		for _, o := range outs {
			b := e.newBatch(o.ps.id, join && o.ps == e.global)
			o.ps.cache.Compact(b, o.reqs...)
			if !e.submit(now, b) {
				return true, false
			}
		}
		// Keep the slices, drop what they point to.
		clear(e.batch.Requests)
		for i := range outs {
			clear(outs[i].reqs)
			outs[i].ps, outs[i].reqs = nil, outs[i].reqs[:0]
		}
		e.outs = outs[:0]
		clear(q)
		e.spare = q[:0]
	}
	if closed && e.inflight == 0 {
		return len(q) > 0, false
	}
	return len(q) > 0, true
}

// sendBehind queues again, in the order they came, the ops of ps that waited for the pending
// refusal of name (see reserve), now that it has its answer.
func (e *Engine) sendBehind(ps *procSet, name string) {
	ens := ps.behind[name]
	if len(ens) == 0 {
		return
	}
	delete(ps.behind, name)
	e.inflight -= len(ens)
	e.mu.Lock()
	e.queue = append(e.queue, ens...)
	e.queued.Store(int32(len(e.queue)))
	e.mu.Unlock()
}

// addOutgoing appends an empty request list for ps to outs, reusing the list an earlier cycle left
// in outs' capacity.
func addOutgoing(outs []outgoing, ps *procSet) []outgoing {
	if len(outs) < cap(outs) {
		outs = outs[:len(outs)+1]
		o := &outs[len(outs)-1]
		o.ps, o.reqs = ps, o.reqs[:0]
		return outs
	}
	return append(outs, outgoing{ps: ps})
}

// newBatch returns the engine's one Batch, emptied, for process set `set`. It is valid until the
// next call; submit copies what it needs.
func (e *Engine) newBatch(set int, join bool) *negotiate.Batch {
	b := &e.batch
	b.Rank, b.Seen, b.Set, b.Join = 0, 0, set, join
	b.Requests, b.Cached = b.Requests[:0], b.Cached[:0]
	return b
}

// submit hands one of this rank's Batches to the coordinator: its Hub on rank 0, else rank 0.
func (e *Engine) submit(now time.Time, b *negotiate.Batch) bool {
	e.sent.Add(uint64(len(b.Requests) + len(b.Cached)))
	e.sentIDs.Add(uint64(len(b.Cached)))
	if e.hub != nil {
		e.arrived(now, e.g.Rank, b)
		if err := e.hub.SubmitBatch(now, e.g.Rank, b); err != nil {
			e.fail(fmt.Errorf("rank 0: %w", err))
			return false
		}
		return true
	}
	e.msgBuf = negotiate.EncodeBatch(e.msgBuf[:0], b)
	if err := e.sendControl(0, e.msgBuf, "send requests to the coordinator"); err != nil {
		e.failCollective(err)
		return false
	}
	return true
}

// Requests returns how many ops this rank has submitted to the coordinator so far, and how many
// of them it sent as response-cache ids: a known op costs a few bytes instead of its whole
// request.
func (e *Engine) Requests() (ops, asIDs uint64) { return e.sent.Load(), e.sentIDs.Load() }

// sendControl sends a control message to rank r within the progress timeout. A control message
// is small, so a send that cannot finish in that time waits on a peer that reads nothing: stopped,
// or stuck in a collective of its own. It fails as a stalled collective does (a *stallFailure
// naming r), so that every rank follows the waits to the stuck rank; other errors name r lost.
// Only the driver sends this way, one message at a time, under one long-lived context that the
// send watchdog cancels (watchSends): no timer or context per message, so a negotiation cycle
// still allocates nothing.
func (e *Engine) sendControl(r int, body []byte, what string) error {
	ctx := context.Background()
	if e.sendCtx != nil {
		ctx = e.sendCtx
		e.sendSince.Store(time.Now().UnixNano())
	}
	err := e.g.Messenger.SendMsg(ctx, r, body)
	if e.sendCtx != nil {
		e.sendSince.Store(0)
	}
	if err == nil {
		return nil
	}
	if ctx.Err() != nil && errors.Is(context.Cause(ctx), errSendStalled) {
		// A new context for later sends (the engine stops now, but Shutdown may still send).
		ctx, cancel := context.WithCancelCause(context.Background())
		e.sendCancelMu.Lock()
		e.sendCtx, e.sendCancel = ctx, cancel
		e.sendCancelMu.Unlock()
		se := transport.StallError{Rank: r, Host: e.host(r), Op: what, For: e.cfg.ProgressTimeout,
			Detail: fmt.Sprintf("a %d-byte control message not taken", len(body))}
		return &stallFailure{msg: fmt.Sprintf("rank %d: %v", e.g.Rank, &se), stall: se}
	}
	return e.lostError(r, fmt.Errorf("%s: %w", what, err))
}

// errSendStalled is the cause the send watchdog cancels a control send with.
var errSendStalled = errors.New("control message not taken within the progress timeout")

// watchSends is the send watchdog: every quarter of the progress timeout it looks at the driver's
// control send in progress, if any, and cancels it once it has waited the whole timeout.
func (e *Engine) watchSends() {
	every := keepAliveEvery(e.cfg.ProgressTimeout)
	t := time.NewTicker(every)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-e.stopped:
			return
		case <-t.C:
		}
		now := time.Now()
		frozen := transport.NotRunning(now.Sub(last), every)
		last = now
		since := e.sendSince.Load()
		if since == 0 {
			continue
		}
		if frozen {
			// Its own pause is not the peer's fault: the send's clock starts again.
			e.sendSince.CompareAndSwap(since, now.UnixNano())
			continue
		}
		if now.Sub(time.Unix(0, since)) >= e.cfg.ProgressTimeout {
			e.sendCancelMu.Lock()
			cancel := e.sendCancel
			e.sendCancelMu.Unlock()
			cancel(errSendStalled)
		}
	}
}

// inSet writes " in process set N" for sets other than the global one.
func inSet(id int) string {
	if id == 0 {
		return ""
	}
	return fmt.Sprintf(" in process set %d", id)
}

// handleMsg acts on one control message. It returns false when the loop must end.
func (e *Engine) handleMsg(m transport.Msg) bool {
	if m.Body == nil && e.leaving {
		return false
	}
	if m.Body == nil {
		err := e.g.Messenger.Lost(m.From)
		if err == nil {
			err = &transport.PeerError{Rank: m.From, Host: e.host(m.From), Op: "control", Err: errors.New("connection closed")}
		}
		// The peer may have closed because another rank told it why the job stops, before that
		// rank's notice reached this one: report the root cause, as a collective does.
		e.failCollective(e.lostError(m.From, err))
		return false
	}
	malformed := func(err error) bool {
		e.fail(fmt.Errorf("rank %d: malformed control message from rank %d: %w", e.g.Rank, m.From, err))
		return false
	}
	kind, err := negotiate.PeekKind(m.Body)
	if err != nil {
		return malformed(err)
	}
	switch {
	case kind == negotiate.MsgKeepAlive:
		// Rank 0 runs, or (on rank 0) the sender's process does: step has noted that it heard
		// from it.
		if err := negotiate.DecodeKeepAlive(m.Body); err != nil {
			return malformed(err)
		}
	case kind == negotiate.MsgAbort:
		a, err := negotiate.DecodeAbort(m.Body)
		if err != nil {
			return malformed(err)
		}
		if a.Stalled {
			e.resolveStall(a, false, e.cfg.ProgressTimeout)
			return false
		}
		// The aborting rank tells every rank itself: passing the notice on would only send each
		// one n-1 more copies of it.
		e.stop(&PeerFailedError{Rank: a.Rank, Reason: a.Reason})
		return false
	case kind == negotiate.MsgSettings:
		st, err := negotiate.DecodeSettings(m.Body)
		if err != nil {
			return malformed(err)
		}
		e.receiveSettings(st)
	case kind == negotiate.MsgBatch && e.hub != nil:
		b, err := negotiate.DecodeBatch(m.Body)
		if err != nil {
			return malformed(err)
		}
		if e.hub.Coordinator(b.Set) == nil && e.table.Removed(b.Set) {
			// Sent before its rank learned that the set was removed; the rank fails these ops
			// itself when it applies the removal.
			return true
		}
		if tl := e.tl.Load(); tl != nil {
			e.timelineBatch(tl, m.From, b)
		}
		now := time.Now()
		e.arrived(now, m.From, b)
		if err := e.hub.SubmitBatch(now, m.From, b); err != nil {
			return malformed(err)
		}
	case (kind == negotiate.MsgResponses || kind == negotiate.MsgSetResponses) && e.hub == nil:
		set, resps, err := negotiate.DecodeSetResponses(m.Body)
		if err != nil {
			return malformed(err)
		}
		ps := e.sets[set]
		if ps == nil || ps.rank < 0 {
			return malformed(fmt.Errorf("responses of process set %d, which this rank is not in", set))
		}
		for i := range resps {
			if !e.execute(ps, &resps[i]) {
				return false
			}
		}
		return e.reportSeen()
	default:
		return malformed(fmt.Errorf("unexpected message kind %d on rank %d", kind, e.g.Rank))
	}
	return true
}

// decide (coordinator only) broadcasts and executes whatever became ready.
func (e *Engine) decide() bool { return e.publish(e.hub.Ready()) }

// publish (coordinator only) sends each set's responses to its members, then executes, in the same
// order, those of the sets this rank is in. Sending everything first lets the members of a later
// set start while this rank runs an earlier one.
func (e *Engine) publish(out []negotiate.SetResponses) bool {
	if len(out) == 0 {
		return true
	}
	e.answered(out)
	for i := range out {
		sr := &out[i]
		if len(sr.Members) == 1 && sr.Members[0] == e.g.Rank {
			continue
		}
		if e.sets[sr.Set].rank < 0 {
			// Coordinated here, run by its members only: its negotiation ends now, before any
			// member can complete the op (and a timeline stopped then still has the end).
			if tl := e.tl.Load(); tl != nil {
				for j := range sr.Responses {
					tl.Done(sr.Set, sr.Responses[j].Names)
				}
			}
		}
		e.msgBuf = negotiate.EncodeSetResponses(e.msgBuf[:0], sr.Set, sr.Responses)
		for _, r := range sr.Members {
			if r == e.g.Rank {
				continue
			}
			if err := e.sendControl(r, e.msgBuf, "send responses"); err != nil {
				e.failCollective(err)
				return false
			}
		}
	}
	for i := range out {
		sr := &out[i]
		ps := e.sets[sr.Set]
		if ps.rank < 0 {
			continue // coordinated here, run by its members only (marked done above)
		}
		for j := range sr.Responses {
			if !e.execute(ps, &sr.Responses[j]) {
				return false
			}
		}
	}
	return e.reportSeen()
}

// reportSeen tells the coordinator how far a joined rank has read the response stream. A joined
// rank submits nothing, so without this its Seen would stop and evicted cache ids would never be
// reused.
func (e *Engine) reportSeen() bool {
	if e.joining == nil || e.leaving {
		return true
	}
	b := e.newBatch(0, false)
	e.global.cache.Compact(b)
	return e.submit(time.Now(), b)
}

// tick runs the stall inspector (coordinator only) and publishes the ops it gave up on.
func (e *Engine) tick(now time.Time) bool {
	e.refreshFigures(now)
	resps, stalls := e.hub.Tick(now)
	for _, s := range stalls {
		slog.Warn("kolo: stalled op: "+s.String(), "rank", e.g.Rank)
	}
	return e.publish(resps)
}

// execute runs one response of process set ps (of which this rank is a member). It returns false
// when the loop must end.
func (e *Engine) execute(ps *procSet, r *negotiate.Response) bool {
	if err := ps.cache.Learn(r); err != nil {
		e.fail(err)
		return false
	}
	if r.Kind == negotiate.Retune {
		if ps != e.global {
			e.fail(fmt.Errorf("rank %d: malformed control message: a retune in the responses of process set %d (only the global set's carry them)", e.g.Rank, ps.id))
			return false
		}
		e.retune(r)
		return true
	}
	if ps == e.global {
		if r.Kind == negotiate.Barrier && r.Error == "" && slices.Contains(r.Names, shutdownName) {
			e.leaving = true
		}
		if r.Kind == negotiate.Join && r.Error == "" {
			e.joins.Add(1) // before the join handle completes: its caller's next op sees it
			if e.joining != nil {
				e.joining.h.joinLast = r.LastJoined
				e.joining.h.finish(nil)
				e.joining = nil
			}
			return true
		}
	}
	tl := e.tl.Load()
	if tl != nil {
		tl.Negotiated(ps.id, r.Names, opLabel(r.Kind))
	}
	entries := make([]*entry, len(r.Names))
	changes := false
	for i, n := range r.Names {
		if en := ps.pending[n]; en != nil {
			entries[i] = en
			delete(ps.pending, n)
			e.inflight--
			e.sendBehind(ps, n)
		}
		if ps == e.global && reservedName(n) {
			changes = true
			if entries[i] == nil {
				// This rank had joined and proposed nothing; it still applies the verdict.
				entries[i] = &entry{h: newHandle(n, nil)}
			}
		}
	}
	now := time.Now()
	for _, en := range entries {
		if en != nil {
			e.obs.flight.Negotiated(en.fid, now)
		}
	}
	if r.Error != "" {
		if r.Resync > 0 {
			// Before the handles finish: their callers' next unnamed ops must see it.
			e.namesMu.Lock()
			e.resync[ps.id] = resyncPoint{r.Resync, e.joins.Load()}
			e.namesMu.Unlock()
		}
		err := &OpError{Msg: r.Error, Op: firstName(r.Names), Ended: r.Ended, Cause: r.Cause}
		if ps.id != 0 {
			err.Msg = fmt.Sprintf("process set %d: %s", ps.id, r.Error)
		}
		e.lastOpErr.Store(err)
		// Every rank hears of the failed op, those that ended too: only a rank whose own op
		// failed on a peer that ended has something to report.
		if len(err.Ended) > 0 && e.g.PeersEnded != nil && slices.ContainsFunc(entries, func(en *entry) bool { return en != nil }) &&
			!slices.Contains(err.Ended, e.g.Rank) {
			e.g.PeersEnded(err)
		}
		for _, en := range entries {
			if en != nil {
				e.opDone(en, now, true)
				en.h.finish(err)
			}
		}
		if tl != nil {
			tl.Done(ps.id, r.Names)
		}
		return true
	}
	ps.exec.tl, ps.exec.set = tl, ps.id
	if e.hub != nil {
		e.executing.Store(true) // the keepAlive goroutine speaks for this driver meanwhile
	}
	for _, en := range entries {
		if en != nil {
			e.obs.flight.Started(en.fid, now)
		}
	}
	var err error
	switch {
	case !e.onDevice(ps, r):
		err = ps.exec.run(context.Background(), *r, entries)
	case len(r.Joined) > 0:
		// Every rank sees the same Joined: the op fails alike everywhere, and the job goes on.
		oe := &OpError{Msg: fmt.Sprintf("%s %s: %v %v", r.Kind, quoteNames(r.Names), errJoined, r.Joined), Cause: negotiate.Mismatch}
		for _, en := range entries {
			if en != nil {
				en.h.finish(oe)
			}
		}
	default:
		err = e.runDevice(ps, r, entries)
	}
	if e.hub != nil {
		e.executing.Store(false)
	}
	done := time.Now()
	var reduced int64
	for _, en := range entries {
		if en != nil {
			e.opDone(en, done, err != nil)
			if r.Kind == negotiate.Allreduce || r.Kind == negotiate.ReduceScatter {
				reduced += en.inBytes()
			}
		}
	}
	e.obs.meter.Collective(done.Sub(now), reduced)
	ps.exec.tl = nil
	if tl != nil {
		tl.Done(ps.id, r.Names)
	}
	if err == nil {
		if changes && !e.applySetChanges(r, entries) {
			return false
		}
		for _, en := range entries {
			if en != nil {
				en.h.finish(nil)
			}
		}
		return true
	}
	if e.leaving {
		// Every rank reached Shutdown; a peer that already left is not an error.
		for _, en := range entries {
			if en != nil {
				en.h.finish(nil)
			}
		}
		return false
	}
	// A failed collective leaves peers mid-protocol: the job cannot go on. The op's own handles are
	// no longer pending anywhere, so fail does not see them: finish them here, or their callers
	// wait forever.
	e.failCollective(err)
	for _, en := range entries {
		if en != nil {
			en.h.finish(e.Err())
		}
	}
	return false
}

// abortLookWait bounds how long a rank whose collective lost a peer looks for that peer's abort
// notice among its control messages.
const abortLookWait = 100 * time.Millisecond

// failCollective stops the engine after a collective failed or a peer's control connection
// closed. A rank that aborted meanwhile stops
// with its own reason; one whose collective a local rank's abort ended stops with that reason. A lost peer may have left with an abort notice: it told every rank why before
// it closed its connections, but a rank inside a collective with it sees the closed data
// connection first, and over TCP the notice waits on the control connection until read; the job
// then stops with the notice's reason rather than "rank N lost". The aborting rank told every
// rank, so neither case tells the peers again.
func (e *Engine) failCollective(err error) {
	if a := e.aborted.Load(); a != nil {
		e.stop(*a)
		return
	}
	if errors.Is(err, transport.ErrAborted) {
		// A local rank aborted the host's shared memory after telling every rank why.
		e.stop(err)
		return
	}
	var sf *stallFailure
	if errors.As(err, &sf) {
		e.resolveStall(negotiate.Abort{Rank: e.g.Rank, Reason: sf.msg, Stalled: true, StalledOn: sf.stall.Rank}, true, sf.stall.For)
		return
	}
	if errors.Is(err, transport.ErrPeerLost) {
		if a, ok := e.abortNotice(abortLookWait); ok {
			if a.Stalled {
				// A peer that stopped after a progress deadline: the rank stuck may be another.
				e.resolveStall(a, false, e.cfg.ProgressTimeout)
				return
			}
			e.stop(&PeerFailedError{Rank: a.Rank, Reason: a.Reason})
			return
		}
	}
	e.fail(err)
}

// abortNotice reads the control messages that arrive within wait and returns the first abort
// notice. The engine is stopping: other messages are dropped.
func (e *Engine) abortNotice(wait time.Duration) (negotiate.Abort, bool) {
	deadline := time.Now().Add(wait)
	for {
		m, got, err := e.recv()
		switch {
		case err != nil:
			return negotiate.Abort{}, false
		case got:
			if kind, _ := negotiate.PeekKind(m.Body); kind == negotiate.MsgAbort {
				if a, err := negotiate.DecodeAbort(m.Body); err == nil {
					return a, true
				}
			}
		case time.Now().After(deadline):
			return negotiate.Abort{}, false
		default:
			time.Sleep(time.Millisecond)
		}
	}
}

// A progress deadline names the peer this rank waited on, which may itself have been waiting on
// another: in a ring, when a rank stops, the rank after it waits on it at once, and the rank after
// that waits on that rank a step later; their deadlines pass within a moment of each other. So a
// rank whose deadline passed tells every rank whom it waited on (an Abort notice with Stalled set)
// at once, then gathers such notices for stallListen (or until every rank but one has sent one),
// and follows the waits from the rank it blamed: the chain ends at a rank that waited on nobody,
// the one that is stuck, and this rank stops with the reason of a notice that names it. A rank that learns of a stall from a notice (it
// was idle, or its collective then lost the peer that sent it) gathers and follows the same way,
// without telling anyone. Every rank thus names the same stuck rank, whichever deadline passed
// first. A notice of another kind (a rank that gave up, or was lost, for a reason of its own) ends
// the gathering: that reason is the cause.

// stallListen is how long a rank gathers stall notices: longer than the spread of the ranks'
// deadlines (the transports look every ProgressTimeout/8, at most every second), short beside the
// timeout itself.
func stallListen(timeout time.Duration) time.Duration {
	if timeout <= 0 {
		timeout = transport.DefaultProgressTimeout
	}
	return min(timeout/4, 2*time.Second) + 100*time.Millisecond
}

// resolveStall gathers stall notices, names the stuck rank and stops the engine (see above). first
// is this rank's own notice (own: it tells every peer first) or the first one it received.
func (e *Engine) resolveStall(first negotiate.Abort, own bool, timeout time.Duration) {
	if own {
		if err := e.sendNotice(first); err != nil {
			slog.Warn("kolo: could not tell every peer which rank this rank waited on", "rank", e.g.Rank, "err", err)
		}
	}
	notes := map[int]negotiate.Abort{first.Rank: first}
	deadline := time.Now().Add(stallListen(timeout))
	// Every rank but one waits on another: the one left is stuck, and there is no one else to hear.
	for len(notes) < e.g.Size-1 && time.Now().Before(deadline) {
		m, got, err := e.recv()
		if err != nil {
			break
		}
		if !got {
			time.Sleep(time.Millisecond)
			continue
		}
		if kind, _ := negotiate.PeekKind(m.Body); m.Body == nil || kind != negotiate.MsgAbort {
			continue // a peer that has stopped already, or what it sent before
		}
		a, err := negotiate.DecodeAbort(m.Body)
		if err != nil {
			continue
		}
		if !a.Stalled {
			e.stop(&PeerFailedError{Rank: a.Rank, Reason: a.Reason})
			return
		}
		if _, seen := notes[a.Rank]; !seen {
			notes[a.Rank] = a
		}
	}
	reason, stuck := stallReason(notes, first)
	e.stop(&StuckError{Rank: stuck, Reason: reason})
}

// StuckError is how an engine stops when a peer stopped making progress: Rank is the rank every
// rank found stuck (see resolveStall), Reason the message every rank reports. An elastic worker
// names that rank to the launcher, which then need not wait to find out which worker of the
// round will never ask for the next one.
type StuckError struct {
	Rank   int
	Reason string
}

func (e *StuckError) Error() string { return e.Reason }

// stallReason follows the waits of notes (by sender) from the rank first blamed to the rank stuck,
// one that sent no notice, and returns the reason of the notice that names it: first's own if it
// does, else the lowest sender's, so that every rank picks the same. When the waits go round in a
// cycle, the rank stuck is the one most notices name (the lowest of those): a stuck rank that ran
// again after its peers' deadlines passed, and then met its own, blamed one of them in turn.
func stallReason(notes map[int]negotiate.Abort, first negotiate.Abort) (reason string, stuck int) {
	stuck = first.StalledOn
	for range len(notes) {
		n, ok := notes[stuck]
		if !ok {
			break
		}
		stuck = n.StalledOn
	}
	if _, waits := notes[stuck]; waits {
		named := map[int]int{}
		for _, n := range notes {
			named[n.StalledOn]++
		}
		for r, k := range named {
			if k > named[stuck] || (k == named[stuck] && r < stuck) {
				stuck = r
			}
		}
	}
	if first.StalledOn == stuck {
		return first.Reason, stuck
	}
	best := -1
	for r, n := range notes {
		if n.StalledOn == stuck && (best < 0 || r < best) {
			best = r
		}
	}
	return notes[best].Reason, stuck
}

func (e *Engine) host(r int) string {
	if r >= 0 && r < len(e.g.Hosts) {
		return e.g.Hosts[r]
	}
	return ""
}

// lostError names the lost rank and its host.
func (e *Engine) lostError(r int, err error) error {
	var pe *transport.PeerError
	if errors.As(err, &pe) {
		named := *pe // the transport may hand the same error to other callers: do not edit it
		if named.Host == "" {
			named.Host = e.host(named.Rank)
		}
		return fmt.Errorf("rank %d: %w", e.g.Rank, &named)
	}
	return fmt.Errorf("rank %d: %w", e.g.Rank, &LostError{Rank: r, Host: e.host(r), Err: err})
}

// LostError names a peer whose loss the transport did not name itself (its messages stopped, a
// keep-alive could not be sent).
type LostError struct {
	Rank int
	Host string
	Err  error
}

func (e *LostError) Error() string {
	return fmt.Sprintf("rank %d (%s) lost: %v", e.Rank, e.Host, e.Err)
}
func (e *LostError) Unwrap() error { return e.Err }

// PeerFailedError is how an engine stops when a peer told it why that peer stopped (its abort
// notice): Rank is the peer, Reason its text, which is the error's.
type PeerFailedError struct {
	Rank   int
	Reason string
}

func (e *PeerFailedError) Error() string { return e.Reason }

// tellPeers sends every reachable peer why this rank stops, so that ranks blocked on it report the
// root cause rather than "rank N lost", and aborts the local shared-memory waits. It sends to all
// peers at once, so that one that does not read its messages (its process is stuck, its control
// connection full) delays nobody else's notice, and waits at most tellWait; it logs the peers it
// could not tell, and why.
func (e *Engine) tellPeers(err error) {
	if terr := e.sendAbort(err); terr != nil {
		slog.Warn("kolo: could not tell every peer why this rank stops; they will report it lost instead",
			"rank", e.g.Rank, "err", terr)
	}
	if e.g.Abort != nil {
		e.g.Abort(err)
	}
}

// tellWait bounds how long tellPeers waits for its abort notices to be sent.
const tellWait = 500 * time.Millisecond

// sendAbort sends err's text to every peer not known to be lost, concurrently, for at most
// tellWait. The error names each peer it could not tell.
func (e *Engine) sendAbort(err error) error {
	return e.sendNotice(negotiate.Abort{Rank: e.g.Rank, Reason: err.Error()})
}

// sendNotice sends a to every peer not known to be lost, as sendAbort does.
func (e *Engine) sendNotice(a negotiate.Abort) error {
	body := negotiate.EncodeAbort(nil, a)
	ctx, cancel := context.WithTimeout(context.Background(), tellWait)
	defer cancel()
	type sent struct {
		rank int
		err  error
	}
	results := make(chan sent, e.g.Size) // room for every send: none blocks once we stop waiting
	errs := make([]error, e.g.Size)      // by rank: why the notice did not reach it, if it did not
	pending := 0
	for r := range e.g.Size {
		if r == e.g.Rank || e.g.Messenger.Lost(r) != nil {
			continue
		}
		errs[r] = fmt.Errorf("rank %d: the abort notice was not sent within %v", r, tellWait) // until it is
		pending++
		go func() { results <- sent{r, e.g.Messenger.SendMsg(ctx, r, body)} }()
	}
wait:
	for ; pending > 0; pending-- {
		select {
		case s := <-results:
			errs[s.rank] = nil
			if s.err != nil {
				errs[s.rank] = fmt.Errorf("rank %d: sending the abort notice failed: %w", s.rank, s.err)
			}
		case <-ctx.Done():
			// A Messenger that honours ctx answers at once now; one that does not is left behind,
			// and the ranks still pending keep their "not sent within" error.
			break wait
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("rank %d: %w", e.g.Rank, err)
	}
	return nil
}

// Abort stops the engine because its user failed outside kolo (an uncaught Python exception, an
// error the program gives up on): every pending and future op here fails with err, and every
// peer's with err's text, so ranks blocked on this one say why instead of "rank N lost". It
// returns once the peers have been told, within abortWait+tellWait (about a second): a driver that
// does not give way (busy in a collective) is left to stop at its next step, and a peer that does
// not take its notice in time is logged. Aborting an engine that has already stopped or shut down
// does nothing.
func (e *Engine) Abort(err error) {
	err = &AbortError{Err: err}
	e.mu.Lock()
	done := e.fatal != nil || e.closed || e.told
	e.mu.Unlock()
	if done {
		return
	}
	// Take the drive token, as a waiting caller does, so that fail runs as the driver; a driver
	// that does not give way within abortWait is busy in a collective with peers, which the
	// abort notice and the shared-memory abort end.
	ctx, cancel := context.WithTimeout(context.Background(), abortWait)
	defer cancel()
	if !e.takeToken(ctx, nil) {
		// The driver is inside a collective, which ends when the peers abort theirs (or
		// completes), or it is a caller that drives until its own op ends. Tell the peers without
		// it; its next step then fails every handle here with err.
		e.mu.Lock()
		stopped := e.fatal != nil || e.told // meanwhile, or another Abort tells the peers
		if !stopped {
			e.told = true
			e.aborted.Store(&err)
		}
		e.mu.Unlock()
		if stopped {
			return
		}
		slog.Error("kolo engine aborting: the loop's driver did not give way within "+abortWait.String()+
			" (it may be inside a collective); telling the peers without it", "rank", e.g.Rank, "err", err)
		e.wakeDriver() // in case it sleeps
		e.tellPeers(err)
		close(e.toldDone)
		return
	}
	if !e.ended {
		e.fail(err)
		e.ended = true // the loop stops, as after every other fatal error
	}
	e.release()
}

// AbortError is how an engine stops when its own program gave up (Abort): the failure is this
// rank's own. Its text is the program's error's.
type AbortError struct{ Err error }

func (e *AbortError) Error() string { return e.Err.Error() }
func (e *AbortError) Unwrap() error { return e.Err }

// abortWait bounds how long Abort waits for the driver to give way.
const abortWait = 500 * time.Millisecond

// fail stops the engine (see stop) and tells the peers why (tellPeers) before any handle here
// completes, unless an Abort tells them already.
func (e *Engine) fail(err error) { e.halt(err, true) }

// stop stops the engine without telling the peers: every pending and future op gets err, and the
// local shared-memory waits abort. It is for errors the peers hear of from elsewhere: an abort
// notice a peer sent (the aborting rank tells every rank), or an Abort that tells them without the
// driver (stop then waits until it has). A second stop or fail does nothing.
func (e *Engine) stop(err error) { e.halt(err, false) }

func (e *Engine) halt(err error, tell bool) {
	e.mu.Lock()
	if e.fatal != nil {
		// Already stopped, peers told and every handle then known finished; later ones are
		// refused at Enqueue.
		e.mu.Unlock()
		return
	}
	e.fatal = err
	told := e.told
	q := e.queue
	e.queue = nil
	e.mu.Unlock()
	slog.Error("kolo engine stopped", "rank", e.g.Rank, "err", err)
	// Device collectives stuck on a lost peer end only when aborted; every rank's engine stops, so
	// every rank aborts its own.
	e.dev.abort(err)
	if tell && !told {
		e.tellPeers(err) // aborts the local shared-memory waits too
	} else {
		if e.g.Abort != nil {
			e.g.Abort(err)
		}
		if told {
			<-e.toldDone // an Abort is telling the peers: they hear before any caller here does
		}
	}
	if e.g.Stopped != nil {
		e.g.Stopped(err)
	}
	for _, ps := range e.sets {
		for _, en := range ps.pending {
			en.h.finish(err)
		}
		clear(ps.pending)
		for _, ens := range ps.behind {
			for _, en := range ens {
				en.h.finish(err)
			}
		}
		clear(ps.behind)
	}
	e.inflight = 0
	if e.joining != nil {
		e.joining.h.finish(err)
		e.joining = nil
	}
	for _, en := range q {
		en.h.finish(err)
	}
}

// OpError is an op that failed by negotiation (mismatch, stall) while the job goes on.
type OpError struct {
	Msg string
	Op  string // the op's name (the first of a fused group's)
	// Ended are the ranks that ended (reached shutdown) without submitting the op: its cause.
	Ended []int
	// Cause says whether the ranks disagreed on the op (negotiate.Mismatch: every rank needed
	// was there) or a rank will never submit it (negotiate.Failed).
	Cause negotiate.Cause
}

// LastOpError is the last op error this engine handed to a caller, nil if none: a program that
// leaves on a failed op, as kolo's Python binding reports it, left on this one.
func (e *Engine) LastOpError() *OpError { return e.lastOpErr.Load() }

func firstName(names []string) string {
	if len(names) == 0 {
		return ""
	}
	return names[0]
}

func (e *OpError) Error() string { return e.Msg }

// Is makes an OpError of cause negotiate.Mismatch match ErrMismatch.
func (e *OpError) Is(target error) bool {
	return target == ErrMismatch && e.Cause == negotiate.Mismatch
}

// ErrMismatch is matched (errors.Is) by the OpError of an op the ranks disagreed on (a dtype, a
// shape, a root, ...), or could not run as they submitted it: every rank needed was there, and the
// job goes on. Horovod raises a precondition error for it (tf.errors.FailedPreconditionError).
var ErrMismatch = errors.New("the ranks disagreed on the op")

// shutdownName is the barrier every rank passes on the way out.
const shutdownName = negotiate.ShutdownName

// Shutdown waits (up to Config.ShutdownWait) until every rank reaches Shutdown, so that no rank
// tears down connections another rank still needs, then stops the loop. Ops still pending fail
// with ErrShutdown.
func (e *Engine) Shutdown(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, e.cfg.ShutdownWait)
	defer cancel()
	var err error
	if e.Err() == nil && e.g.Size > 1 {
		h := e.Enqueue(negotiate.Request{Name: shutdownName, Kind: negotiate.Barrier}, nil, nil)
		if werr := h.Wait(ctx); werr != nil {
			err = fmt.Errorf("rank %d: shutdown: waiting for every rank to reach shutdown: %w", e.g.Rank, werr)
		}
	}
	e.mu.Lock()
	e.closed = true
	e.mu.Unlock()
	// The background goroutine ends the loop; a caller driving at the moment hands it over.
	e.summonBackground()
	e.wakeDriver()
	select {
	case <-e.stopped:
	case <-ctx.Done():
	}
	e.mu.Lock()
	q := e.queue
	e.queue = nil
	e.queued.Store(0)
	e.mu.Unlock()
	for _, en := range q {
		en.h.finish(ErrShutdown)
	}
	e.dev.close(ctx)
	if terr := e.StopTimeline(); err == nil {
		err = terr
	}
	return err
}

// opDone records en's end at now in the flight recorder and the meter.
func (e *Engine) opDone(en *entry, now time.Time, failed bool) {
	e.obs.flight.Finished(en.fid, now, failed)
	e.obs.meter.OpDone(en.req.Kind.String(), now.Sub(en.submitted), failed)
}
