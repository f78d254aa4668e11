package engine

// The device path: ops on tensors in accelerator memory, run by a gpu.Comm on the engine's own
// stream (device_execute.go), negotiated exactly as host ops are.
//
// It is set up once per engine, the first time this rank has a device op (DevicePath): users call
// hvd.init() before torch.cuda.set_device, so the device is known only then. Setting up is an op
// of kolo's own (deviceSetupName), an allgather of the global set negotiated like any other: each
// rank gathers every rank's gpu.Peer, its gpu.Setting and rank 0's communicator id, and runs the
// pure gpu.Decide on the same data at the same place of the response stream, so every rank reaches
// the same Decision. When it says Use, every rank joins the communicator (Library.NewComm, under
// the progress deadline) and from then on routes responses of GPU tensors that the device path
// serves (deviceServes) to the device executor; the rest runs on the host path as before.
//
// Process sets get a communicator each, formed where every rank is at the same place of the
// stream: when the device path starts (the sets existing then, by id) and when a set is added. It
// is split from the global one (gpu.Splitter), or, with a library that cannot split, formed by the
// set's members from an id sent over the set's host path. A set whose communicator did not form
// has no device path: its device ops are refused, so that the binding stages them.
//
// The path never hangs: a watchdog (deviceWatch) follows the device work in flight; it has the
// loop read control messages meanwhile (a lost peer is seen as on the host path), stops the
// engine when a communicator reports an error or work makes no progress for the progress
// deadline, and every stop of the engine aborts every communicator (halt), which ends the
// collectives stuck on a lost peer, on every rank.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kolo-dl/kolo/collective"
	"github.com/kolo-dl/kolo/dtype"
	"github.com/kolo-dl/kolo/engine/negotiate"
	"github.com/kolo-dl/kolo/gpu"
)

// DeviceBackend is how an engine reaches accelerators. The engine calls it only when this rank
// first has a device op, never at New: a CPU job never loads a device library.
type DeviceBackend struct {
	// Setting is what the user asked for (gpu.ParseMode); rank 0's counts for the job.
	Setting gpu.Setting
	// HostID is this rank's NCCL_HOSTID ("" if unset).
	HostID string
	// Open loads the library. An error (matching gpu.ErrUnavailable) is why this rank's device
	// path cannot serve; it goes to every rank as gpu.Peer.Problem.
	Open func() (gpu.Library, gpu.Version, error)
	// Device opens device ordinal of lib and returns it with its identity across processes (its
	// PCI bus id), which tells ranks that share a GPU.
	Device func(lib gpu.Library, ordinal int) (dev gpu.Device, busID string, err error)
}

// ErrDeviceSetup is matched by DevicePath's error when setting up the device path failed (a
// communicator that did not form, a device that did not open) rather than was declined.
var ErrDeviceSetup = errors.New("device path setup failed")

// deviceSetupName is the allgather that sets the device path up; users cannot submit names with
// kolo's reserved prefixes.
const deviceSetupName = "kolo.device_setup"

// reservedName reports whether name is one of kolo's own op names.
func reservedName(name string) bool {
	return strings.HasPrefix(name, setChangePrefix) || strings.HasPrefix(name, deviceSetupName)
}

// devicePath is an engine's device state. Fields set by the driver when the setup op executes are
// read by other goroutines only after decided is closed.
type devicePath struct {
	mu      sync.Mutex
	started bool
	ordinal int
	dev     gpu.Device
	lib     gpu.Library
	peer    gpu.Peer
	decided chan struct{} // closed once decision and err are set

	decision gpu.Decision
	err      error

	use atomic.Bool // decided with Use: GPU responses the path serves run on the device

	// Driver-owned after the decision.
	stream    gpu.Stream // the engine's own stream: every device op runs on it, in response order
	comm      gpu.Comm   // the global set's
	fusion    gpu.Ptr
	fusionCap int
	retired   []gpu.Ptr // outgrown fusion buffers: work queued on the stream may still read them

	// work in flight and memory to free, shared with the watchdog and the handles.
	wmu      sync.Mutex
	inflight []*deviceWork
	frees    []deferredFree
	events   []gpu.Event // completed, for reuse: an event per op from the library costs a call
	progress time.Time   // when work last completed
	comms    []gpu.Comm  // every communicator, for abort
	closed   bool
	stopWait chan struct{}
}

// deviceWork is one response's device work: its done event and the results waiting on it.
type deviceWork struct {
	done    gpu.Event
	since   time.Time
	what    string
	results []*deviceResult
}

// deferredFree is device memory to free once ev (recorded after the last reader) completed.
type deferredFree struct {
	p  gpu.Ptr
	ev gpu.Event
}

func newDevicePath() *devicePath {
	return &devicePath{decided: make(chan struct{}), stopWait: make(chan struct{})}
}

// setupPayload is one rank's part of the setup allgather.
type setupPayload struct {
	Peer    gpu.Peer
	Setting gpu.Setting
	ID      []byte `json:",omitempty"` // rank 0's communicator id, when its library loaded
	IDErr   string `json:",omitempty"` // why rank 0 has none
}

// DevicePath sets up the device path for device ordinal on first use and returns the job's
// decision, the same on every rank: Use, or why GPU tensors are staged through host memory. It
// blocks until every rank has called it (the decision needs everyone's gpu.Peer) or ctx ends.
// The error is set when the user required the device path (KOLO_NCCL=1) and it cannot serve
// (gpu.ErrForcedOn), or setup failed (ErrDeviceSetup); the job's host path goes on either way.
func (e *Engine) DevicePath(ctx context.Context, ordinal int) (gpu.Decision, error) {
	d := e.dev
	d.mu.Lock()
	if d.started && d.ordinal != ordinal {
		d.mu.Unlock()
		return gpu.Decision{}, fmt.Errorf("rank %d: device path: set up on device %d, asked for device %d (one device per rank)", e.g.Rank, d.ordinal, ordinal)
	}
	first := !d.started
	d.started, d.ordinal = true, ordinal
	d.mu.Unlock()
	if first {
		e.startSetup(ordinal)
	}
	select {
	case <-d.decided:
		return d.decision, d.err
	case <-ctx.Done():
	}
	// Nobody else may be driving: wait on the setup op itself, which drives the loop.
	select {
	case <-d.decided:
		return d.decision, d.err
	default:
		return gpu.Decision{}, fmt.Errorf("rank %d: device path: waiting for every rank to set up its device (every rank's first device op, or DevicePath): %w", e.g.Rank, ctx.Err())
	}
}

// Decided returns the device path's decision if it has been made.
func (e *Engine) Decided() (gpu.Decision, bool) {
	select {
	case <-e.dev.decided:
		return e.dev.decision, true
	default:
		return gpu.Decision{}, false
	}
}

// startSetup opens this rank's library and device and submits its part of the setup allgather.
func (e *Engine) startSetup(ordinal int) {
	d := e.dev
	p := setupPayload{Peer: gpu.Peer{Host: e.host(e.g.Rank)}}
	switch b := e.cfg.Device; {
	case b == nil:
		p.Peer.Problem = "this kolo has no device backend"
	case b.Setting.Mode == gpu.Off:
		// The library is never loaded: Decide stages for the setting alone.
		p.Setting, p.Peer.HostID = b.Setting, b.HostID
	default:
		p.Setting, p.Peer.HostID = b.Setting, b.HostID
		if lib, v, err := b.Open(); err != nil {
			// Decide says it is ErrUnavailable: once is enough.
			p.Peer.Problem = strings.TrimPrefix(err.Error(), gpu.ErrUnavailable.Error()+": ")
		} else if dev, bus, err := b.Device(lib, ordinal); err != nil {
			p.Peer.Problem = fmt.Sprintf("device %d: %v", ordinal, err)
		} else {
			d.lib, d.dev = lib, dev
			p.Peer.NCCL, p.Peer.GPU = v, bus
			if bus == "" {
				p.Peer.GPU = fmt.Sprint(ordinal)
			}
		}
		if e.g.Rank == 0 && d.lib != nil {
			if id, err := d.lib.NewUniqueID(); err != nil {
				p.IDErr = err.Error()
			} else {
				p.ID = id[:]
			}
		}
	}
	d.peer = p.Peer
	payload, _ := json.Marshal(p) // plain strings and numbers: cannot fail
	req := negotiate.Request{Name: deviceSetupName, Kind: negotiate.Allgather, DType: dtype.Uint8,
		Shape: []int64{int64(len(payload))}}
	h := e.enqueue(req, payload, nil, true, nil)
	go func() {
		// The setup op completes when its response executed (applyDeviceSetup decided) or the
		// engine stopped; the decision must be made either way, or DevicePath waits forever.
		// Waiting drives the loop when nobody else does.
		_ = h.Wait(context.Background())
		if err := h.Err(); err != nil {
			e.decideDevice(gpu.Decision{Why: fmt.Errorf("%w: %w", gpu.ErrUnavailable, err)},
				fmt.Errorf("rank %d: %w: %w", e.g.Rank, ErrDeviceSetup, err))
		}
	}()
}

// decideDevice records the decision once; later calls do nothing.
func (e *Engine) decideDevice(dec gpu.Decision, err error) {
	d := e.dev
	d.mu.Lock()
	defer d.mu.Unlock()
	select {
	case <-d.decided:
		return
	default:
	}
	d.decision, d.err = dec, err
	close(d.decided)
}

// applyDeviceSetup runs on every rank where the setup allgather executed (the driver): it decodes
// every rank's part, decides, and forms the communicators.
func (e *Engine) applyDeviceSetup(gathered []byte, rows []int64) error {
	d := e.dev
	parts := make([]setupPayload, len(rows))
	peers := make([]gpu.Peer, len(rows))
	off := int64(0)
	for r, n := range rows {
		if n == 0 {
			err := fmt.Errorf("rank %d set up no device (it had joined)", r)
			e.decideDevice(gpu.Decision{Why: fmt.Errorf("%w: %w", gpu.ErrUnavailable, err)}, fmt.Errorf("%w: %w", ErrDeviceSetup, err))
			return nil
		}
		if err := json.Unmarshal(gathered[off:off+n], &parts[r]); err != nil {
			return fmt.Errorf("rank %d: device setup from rank %d: %w", e.g.Rank, r, err)
		}
		peers[r] = parts[r].Peer
		off += n
	}
	setting := parts[0].Setting
	dec, err := gpu.Decide(setting, peers)
	if dec.Use && len(parts[0].ID) != gpu.UniqueIDBytes {
		dec = gpu.Decision{Why: fmt.Errorf("%w: rank 0 has no communicator id: %s", gpu.ErrUnavailable, parts[0].IDErr)}
		if setting.Mode == gpu.On {
			err = fmt.Errorf("%s: %w: %w", setting.From, gpu.ErrForcedOn, dec.Why)
		}
	}
	if !dec.Use {
		slog.Info("kolo: GPU tensors are staged through host memory", "rank", e.g.Rank, "why", dec.Why)
		e.decideDevice(dec, err)
		return nil
	}
	var id gpu.UniqueID
	copy(id[:], parts[0].ID)
	ctx, cancel := e.deviceCtx()
	defer cancel()
	comm, err := d.lib.NewComm(ctx, d.dev, id, e.g.Size, e.g.Rank)
	if err == nil {
		d.stream, err = d.dev.NewStream()
		if err != nil {
			_ = comm.Abort()
		}
	}
	if err != nil {
		err = fmt.Errorf("rank %d: %w: forming the communicator of %d ranks: %w", e.g.Rank, ErrDeviceSetup, e.g.Size, err)
		e.decideDevice(gpu.Decision{Why: fmt.Errorf("%w: %w", gpu.ErrUnavailable, err)}, err)
		return nil
	}
	d.comm = comm
	d.addComm(comm)
	e.global.dcomm = comm
	ids := make([]int, 0, len(e.sets))
	for id := range e.sets {
		if id != 0 {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids) // Split is collective in call order: every rank splits in the same order
	for _, id := range ids {
		e.splitSet(e.sets[id])
	}
	d.use.Store(true)
	go e.deviceWatch()
	slog.Info("kolo: GPU tensors use the device path", "rank", e.g.Rank, "ranks", e.g.Size, "nccl", d.peer.NCCL, "device", d.peer.GPU,
		"why", fmt.Sprintf("every rank's library loads (%s) and no two ranks share a GPU under one NCCL_HOSTID", modeFrom(setting)))
	e.decideDevice(dec, nil)
	return nil
}

func modeFrom(s gpu.Setting) string {
	if s.From == "" {
		return "mode auto"
	}
	return s.From
}

// deviceCtx bounds a blocking device call (forming a communicator) by the progress deadline.
func (e *Engine) deviceCtx() (context.Context, context.CancelFunc) {
	if e.cfg.ProgressTimeout > 0 {
		return context.WithTimeout(context.Background(), e.cfg.ProgressTimeout)
	}
	return context.WithCancel(context.Background())
}

// splitSet forms process set ps's communicator. Every rank calls it at the same place of the
// stream. With ncclCommSplit, every rank of the job splits the global communicator (members with
// one color, the others with none); without it, the set's members form a new one, its id
// broadcast from the set's first rank over the set's host path.
func (e *Engine) splitSet(ps *procSet) {
	d := e.dev
	ctx, cancel := e.deviceCtx()
	defer cancel()
	sp, ok := d.comm.(gpu.Splitter)
	if !ok {
		if ps.rank >= 0 {
			e.formSetComm(ctx, ps)
		}
		return
	}
	color := gpu.NoColor
	if ps.rank >= 0 {
		color = 0
	}
	c, err := sp.Split(ctx, color, ps.rank)
	if err != nil {
		ps.dcommErr = fmt.Errorf("%w: process set %d: split: %w", gpu.ErrUnavailable, ps.id, err)
		return
	}
	if c != nil {
		ps.dcomm = c
		d.addComm(c)
	}
}

// formSetComm forms member ps's communicator from a fresh id, which the set's first rank makes
// and broadcasts (a leading byte says whether it could: the others must not join a comm of none).
func (e *Engine) formSetComm(ctx context.Context, ps *procSet) {
	d := e.dev
	buf := make([]byte, 1+gpu.UniqueIDBytes)
	var why error
	if ps.rank == 0 {
		id, err := d.lib.NewUniqueID()
		if err != nil {
			why = err
		} else {
			buf[0] = 1
			copy(buf[1:], id[:])
		}
	}
	if len(ps.ranks) > 1 {
		if err := collective.Broadcast(ctx, ps.exec.comm(), buf, 0, ps.exec.tuning()); err != nil {
			why = fmt.Errorf("sending the communicator id: %w", err)
		}
	}
	if why == nil && buf[0] == 0 {
		why = fmt.Errorf("the set's first rank (rank %d) made no communicator id", ps.ranks[0])
	}
	if why == nil {
		var id gpu.UniqueID
		copy(id[:], buf[1:])
		c, err := d.lib.NewComm(ctx, d.dev, id, len(ps.ranks), ps.rank)
		if err == nil {
			ps.dcomm = c
			d.addComm(c)
			return
		}
		why = err
	}
	ps.dcommErr = fmt.Errorf("%w: process set %d: forming its communicator: %w", gpu.ErrUnavailable, ps.id, why)
}

func (d *devicePath) addComm(c gpu.Comm) {
	d.wmu.Lock()
	d.comms = append(d.comms, c)
	d.wmu.Unlock()
}

// DeviceOp is the device side of an op on tensors in device memory.
type DeviceOp struct {
	Ordinal int
	// Stream is the producer's stream (torch's current stream, adopted with Device.WrapStream):
	// the engine's work waits for what was enqueued on it before the op was submitted.
	Stream gpu.Stream
	// In holds the input (the bytes its shape and dtype say); Out receives the result of an
	// allreduce or broadcast (as many bytes; it may be In). Allgather, alltoall and reducescatter
	// leave theirs in memory the engine allocates (Handle.DeviceOutput).
	In, Out gpu.Ptr
	Bytes   int // In's size in bytes
}

// EnqueueDevice submits an op on device memory. The handle completes when the op's device work is
// enqueued on the engine's stream, not when it has run: the caller then makes its consumer stream
// wait on it (Handle.WaitOnStream), or blocks the host (Handle.Synchronize).
//
// The op is refused, and the caller stages it through host memory as before, when the device path
// is not in use (the error matches gpu.ErrUnavailable and says why) or cannot run it: Adasum,
// element types NCCL lacks, prescale or postscale factors (no kernels run without a CUDA compiler:
// the binding scales with torch ops before and after). Average uses NCCL's Avg: for floats each
// input is multiplied by 1/n, then summed; for integers the sum is divided by n and truncated
// toward zero, which is what the host path's postscale of 1/n gives integers.
func (e *Engine) EnqueueDevice(req negotiate.Request, op DeviceOp) *Handle {
	h := newHandle(req.Name, e)
	refuse := func(err error) *Handle {
		h.finish(&ArgumentError{fmt.Errorf("rank %d: %s %q: %w", e.g.Rank, req.Kind, req.Name, err)})
		return h
	}
	if reservedName(req.Name) {
		return refuse(errors.New("names starting with kolo's reserved prefixes are kolo's own"))
	}
	d := e.dev
	if _, ok := e.Decided(); !ok {
		ctx, cancel := context.WithTimeout(context.Background(), e.setupWait())
		_, err := e.DevicePath(ctx, op.Ordinal)
		cancel()
		if err != nil {
			h.finish(err)
			return h
		}
	}
	if !d.use.Load() {
		return refuse(d.decision.Why)
	}
	e.mu.Lock()
	ps := e.sets[req.Set]
	e.mu.Unlock()
	if ps != nil && ps.rank >= 0 && ps.dcomm == nil {
		return refuse(ps.dcommErr)
	}
	if op.Ordinal != d.ordinal {
		return refuse(fmt.Errorf("tensor on device %d; the device path runs on device %d", op.Ordinal, d.ordinal))
	}
	if err := deviceServes(req.Kind, req.DType, req.ReduceOp, req.PreScale, req.PostScale); err != nil {
		return refuse(err)
	}
	if op.Stream == nil {
		return refuse(errors.New("no producer stream"))
	}
	ready, err := d.event()
	if err == nil {
		err = op.Stream.Record(ready)
	}
	if err != nil {
		return refuse(fmt.Errorf("recording the ready event on the producer's stream: %w", err))
	}
	req.GPU = true
	dv := &deviceEntry{op: op, ready: ready}
	return e.enqueue(req, nil, nil, true, dv)
}

// setupWait bounds how long an op waits for the device path's setup: the other ranks must reach
// their first device op too.
func (e *Engine) setupWait() time.Duration {
	if e.cfg.SetupTimeout > 0 {
		return e.cfg.SetupTimeout
	}
	return DefaultConfig().SetupTimeout
}

// deviceServes says why the device path cannot run an op of this kind, type and scaling (nil when
// it can). It depends on what every rank negotiated alike, so every rank routes alike.
func deviceServes(kind negotiate.OpKind, t dtype.DType, op uint8, pre, post float64) error {
	switch kind {
	case negotiate.Allreduce, negotiate.Allgather, negotiate.Broadcast, negotiate.Alltoall, negotiate.ReduceScatter:
	default:
		return fmt.Errorf("%w: %s has no device form", gpu.ErrUnavailable, kind)
	}
	if _, err := gpu.FromDType(t); err != nil {
		return err
	}
	if op == negotiate.ReduceAdasum && kind == negotiate.Allreduce {
		return fmt.Errorf("%w: Adasum on GPU tensors is staged through host memory", gpu.ErrUnavailable)
	}
	if (pre != 0 && pre != 1) || (post != 0 && post != 1) {
		return fmt.Errorf("%w: prescale and postscale factors are applied by the caller on its stream (no device kernels)", gpu.ErrUnavailable)
	}
	return nil
}

// onDevice reports whether response r runs on the device path.
func (e *Engine) onDevice(r *negotiate.Response) bool {
	return r.GPU && e.dev.use.Load() && deviceServes(r.Kind, r.DType, r.ReduceOp, r.PreScale, r.PostScale) == nil
}

// deviceEntry is the device side of a submitted op.
type deviceEntry struct {
	op    DeviceOp
	ready gpu.Event // recorded on the producer's stream at submission
}

// deviceResult is what a device op's handle reports.
type deviceResult struct {
	d    *devicePath
	done gpu.Event // recorded on the engine's stream after the op's work
	out  gpu.Ptr   // engine-allocated result (allgather, alltoall, reducescatter); 0: none
	n    int       // its bytes
	err  atomic.Pointer[error]
	rel  atomic.Bool
	ran  atomic.Bool // its work ran, and done went back to the pool
}

// WaitOnStream makes work enqueued on s from now on wait until the op's device work has run,
// without blocking the host: the consumer's side of completion. Call it after Wait returned nil.
func (h *Handle) WaitOnStream(s gpu.Stream) error {
	if !h.Poll() {
		return fmt.Errorf("%q: WaitOnStream before the op completed (call Wait first)", h.name)
	}
	if h.err != nil {
		return h.err
	}
	if h.dev == nil {
		return fmt.Errorf("%q: not a device op", h.name)
	}
	if h.dev.ran.Load() {
		return nil
	}
	return s.WaitEvent(h.dev.done)
}

// Synchronize blocks the host until the op completed and its device work has run, or ctx ends,
// and returns the op's error: one of negotiation, or the engine's if it stopped (a lost rank, the
// progress deadline) before the device work finished.
func (h *Handle) Synchronize(ctx context.Context) error {
	if err := h.Wait(ctx); err != nil {
		return err
	}
	if h.dev == nil {
		return nil
	}
	if !h.dev.ran.Load() {
		if err := h.dev.done.Synchronize(ctx); err != nil {
			return fmt.Errorf("%q: waiting for its device work to run: %w", h.name, err)
		}
	}
	if p := h.dev.err.Load(); p != nil {
		return *p
	}
	return nil
}

// DeviceOutput is the result of a device allgather, alltoall or reducescatter, in device memory
// the engine allocated: its address and size in bytes (Rows and RecvSplits say its shape). The
// caller copies it on its stream after WaitOnStream, then calls ReleaseDeviceOutput.
func (h *Handle) DeviceOutput() (gpu.Ptr, int) {
	if h.dev == nil {
		return 0, 0
	}
	return h.dev.out, h.dev.n
}

// ReleaseDeviceOutput gives the result's memory back once the work enqueued on s so far (the
// caller's copy of it) has run: it is freed then, never while a queued copy may still read it.
// A second release is an error.
func (h *Handle) ReleaseDeviceOutput(s gpu.Stream) error {
	if h.dev == nil || (h.dev.out == 0 && h.dev.n > 0) {
		return fmt.Errorf("%q: no device output to release", h.name)
	}
	if h.dev.rel.Swap(true) {
		return fmt.Errorf("%q: device output released twice", h.name)
	}
	if h.dev.out == 0 {
		return nil // an empty result the library allocated as nothing
	}
	d := h.dev.d
	ev, err := d.event()
	if err == nil {
		err = s.Record(ev)
	}
	if err != nil {
		return fmt.Errorf("%q: release: recording an event after the caller's copy: %w", h.name, err)
	}
	d.wmu.Lock()
	d.frees = append(d.frees, deferredFree{h.dev.out, ev})
	d.wmu.Unlock()
	return nil
}

// deviceWatch follows the device work in flight until the engine stops (see the file comment).
func (e *Engine) deviceWatch() {
	d := e.dev
	every := checkEvery
	if t := e.cfg.ProgressTimeout; t > 0 {
		every = min(every, max(t/8, time.Millisecond))
	}
	tk := time.NewTicker(every)
	defer tk.Stop()
	for {
		select {
		case <-e.stopped:
			return
		case <-d.stopWait:
			return
		case <-tk.C:
		}
		d.reap()
		d.wmu.Lock()
		busy := len(d.inflight) > 0
		var oldest *deviceWork
		var since time.Time // the deadline runs from the later of the oldest work's start and the last completion
		if busy {
			oldest = d.inflight[0]
			since = oldest.since
			if d.progress.After(since) {
				since = d.progress
			}
		}
		comms := slices.Clone(d.comms)
		d.wmu.Unlock()
		if !busy {
			continue
		}
		// A lost peer shows up among the control messages: have the loop read them.
		e.summonBackground()
		for _, c := range comms {
			if err := c.AsyncError(); err != nil {
				e.Abort(fmt.Errorf("rank %d: device communicator failed during %s: %w", e.g.Rank, oldest.what, err))
				return
			}
		}
		if t := e.cfg.ProgressTimeout; t > 0 && time.Since(since) > t {
			e.Abort(fmt.Errorf("rank %d: device %s made no progress for %v (a peer never reached the collective)", e.g.Rank, oldest.what, t))
			return
		}
	}
}

// reap drops the work that has run and frees the memory whose readers have run.
func (d *devicePath) reap() {
	d.wmu.Lock()
	defer d.wmu.Unlock()
	i := 0
	for ; i < len(d.inflight); i++ {
		if ok, _ := d.inflight[i].done.Query(); !ok {
			break
		}
		// A consumer that calls WaitOnStream after this waits on nothing (ran); one that
		// looked before may wait on the event recorded again for later work on the same
		// stream: for more than its op, never for less.
		for _, res := range d.inflight[i].results {
			res.ran.Store(true)
		}
		d.events = append(d.events, d.inflight[i].done)
	}
	if i > 0 {
		d.progress = time.Now()
	}
	d.inflight = d.inflight[i:]
	kept := d.frees[:0]
	for _, f := range d.frees {
		if ok, _ := f.ev.Query(); ok {
			_ = d.dev.Free(f.p)
			d.events = append(d.events, f.ev)
			continue
		}
		kept = append(kept, f)
	}
	d.frees = kept
}

// abort fails the device work in flight with err and aborts every communicator, which ends the
// collectives stuck on a lost peer (on every rank, since every rank's engine stops). halt calls it.
func (d *devicePath) abort(err error) {
	d.wmu.Lock()
	defer d.wmu.Unlock()
	for _, w := range d.inflight {
		for _, res := range w.results {
			res.err.CompareAndSwap(nil, &err)
		}
	}
	for _, c := range d.comms {
		_ = c.Abort()
	}
	d.comms = nil
	if !d.closed {
		d.closed = true
		close(d.stopWait)
	}
}

// close ends the device path at shutdown: work still in flight after ctx ends is aborted; memory
// is freed once the engine's stream has drained.
func (d *devicePath) close(ctx context.Context) {
	select {
	case <-d.decided:
	default:
		return
	}
	if d.stream == nil {
		return
	}
	if err := d.stream.Synchronize(ctx); err != nil {
		d.abort(fmt.Errorf("device work still in flight at shutdown: %w", err))
		return // the stream's memory may still be read: leave it to the process's end
	}
	d.wmu.Lock()
	comms, frees := d.comms, d.frees
	d.comms, d.frees = nil, nil
	if !d.closed {
		d.closed = true
		close(d.stopWait)
	}
	d.wmu.Unlock()
	for _, c := range comms {
		_ = c.Destroy()
	}
	for _, f := range frees {
		_ = f.ev.Synchronize(ctx)
		_ = d.dev.Free(f.p)
	}
	for _, p := range append(d.retired, d.fusion) {
		if p != 0 {
			_ = d.dev.Free(p)
		}
	}
	d.retired, d.fusion, d.fusionCap = nil, 0, 0
	d.wmu.Lock()
	for _, ev := range d.events {
		_ = ev.Destroy()
	}
	d.events = nil
	d.wmu.Unlock()
	_ = d.stream.Destroy()
}

// WrapStream adopts a stream of this rank's device by its handle (torch's cuda_stream), for
// EnqueueDevice, WaitOnStream and ReleaseDeviceOutput. The device path must be in use.
func (e *Engine) WrapStream(handle uintptr) (gpu.Stream, error) {
	if !e.dev.use.Load() {
		return nil, fmt.Errorf("rank %d: wrap stream %#x: the device path is not in use", e.g.Rank, handle)
	}
	s, err := e.dev.dev.WrapStream(handle)
	if err != nil {
		return nil, fmt.Errorf("rank %d: wrap stream %#x: %w", e.g.Rank, handle, err)
	}
	return s, nil
}

// DeviceStream is WrapStream for a device op's submitter: it sets the device path up on ordinal
// first if this rank has not (bounded by Config.SetupTimeout), and fails with the decision's
// reason (gpu.ErrUnavailable) when the path is not in use.
func (e *Engine) DeviceStream(ordinal int, handle uintptr) (gpu.Stream, error) {
	if _, ok := e.Decided(); !ok {
		ctx, cancel := context.WithTimeout(context.Background(), e.setupWait())
		_, err := e.DevicePath(ctx, ordinal)
		cancel()
		if err != nil {
			return nil, err
		}
	}
	if !e.dev.use.Load() {
		return nil, e.dev.decision.Why
	}
	return e.WrapStream(handle)
}

// event is a completed event to record anew: one from the pool, else a new one.
func (d *devicePath) event() (gpu.Event, error) {
	d.wmu.Lock()
	if n := len(d.events); n > 0 {
		ev := d.events[n-1]
		d.events = d.events[:n-1]
		d.wmu.Unlock()
		return ev, nil
	}
	d.wmu.Unlock()
	return d.dev.NewEvent()
}

// recycle returns an event whose latest record a stream wait has captured already (a wait is on
// the record made before it was enqueued, so recording the event again does not move it).
func (d *devicePath) recycle(ev gpu.Event) {
	d.wmu.Lock()
	d.events = append(d.events, ev)
	d.wmu.Unlock()
}

// inBytes is the size of en's input, in host or device memory.
func (en *entry) inBytes() int64 {
	if en.dev != nil {
		return int64(en.dev.op.Bytes)
	}
	return int64(len(en.in))
}

// drop gives back the ready event of a device op that never reaches the executor (nil: a host
// op). Nothing waits on it: the pool may record it again.
func (d *devicePath) drop(dv *deviceEntry) {
	if dv != nil {
		d.recycle(dv.ready)
	}
}
