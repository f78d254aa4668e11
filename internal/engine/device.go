package engine

// The device path: ops on tensors in accelerator memory, run by a gpu.Comm on the engine's own
// stream (device_execute.go), negotiated exactly as host ops are. This file sets the path up;
// device_ops.go submits ops and completes their handles; device_watch.go keeps it from hanging.
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

	"github.com/kolo-dl/kolo/internal/collective"
	"github.com/kolo-dl/kolo/internal/dtype"
	"github.com/kolo-dl/kolo/internal/engine/negotiate"
	"github.com/kolo-dl/kolo/internal/gpu"
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
	wmu       sync.Mutex
	inflight  []*deviceWork
	frees     []deferredFree
	toFree    []gpu.Ptr   // readers ran: for release's goroutine
	releasing bool        // release's goroutine runs
	events    []gpu.Event // completed, for reuse: an event per op from the library costs a call
	progress  time.Time   // when work last completed
	comms     []gpu.Comm  // every communicator, for abort
	closed    bool
	stopWait  chan struct{}
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
