package main

/*
#include <stdint.h>

// kolo_op is the head of the block kolo_enqueue reads: one op, whose shape (ndim int64s), splits
// (nsplits int64s, none when nsplits is -1) and name (nameLen bytes of UTF-8, not NUL-terminated)
// follow it in that order. One block rather than an argument per field because a ctypes caller
// pays a Python call per argument it converts: 17 arguments cost ~2.8 us, most of a small op.
// The fields are the C ABI's argument names; no padding (pointers and doubles first).
typedef struct {
	void *in, *out;
	double prescale, postscale;
	int32_t kind, dt, ndim, reduceOp, root, nsplits, processSet, device, waitUS, nameLen;
} kolo_op;
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"
	"unsafe"

	"github.com/kolo-dl/kolo"
	"github.com/kolo-dl/kolo/internal/dtype"
	"github.com/kolo-dl/kolo/internal/gpu"
)

// Op kinds as the C ABI numbers them: negotiate.OpKind's values.
const (
	kindAllreduce     = 1
	kindAllgather     = 2
	kindBroadcast     = 3
	kindAlltoall      = 4
	kindReduceScatter = 5
	kindBarrier       = 6
	kindJoin          = 7
)

// Results of kolo_poll and kolo_wait.
const (
	statusUnknown = -1 // no such handle (never issued, or released), or a refused argument
	statusPending = 0
	statusOK      = 1
	statusFailed  = 2
)

// op is one entry of the handle table: an op in flight or completed, until the caller releases it.
// Exactly one of h, err and call is set.
type op struct {
	h    *kolo.Handle
	err  error // the arguments were rejected here, before reaching kolo
	call *call // a blocking library call (init, shutdown) on its own goroutine
}

// call is a blocking kolo function running on its own goroutine, so that the caller can wait for
// it in slices as it waits for ops.
type call struct {
	done chan struct{}
	err  error // set before done closes
}

func startCall(f func() error) *call {
	c := &call{done: make(chan struct{})}
	go func() {
		defer close(c.done)
		c.err = f()
	}()
	return c
}

func (o *op) done() bool {
	switch {
	case o.h != nil:
		return o.h.Poll()
	case o.call != nil:
		select {
		case <-o.call.done:
			return true
		default:
			return false
		}
	}
	return true
}

func (o *op) failure() error {
	switch {
	case o.h != nil:
		return o.h.Err()
	case o.call != nil:
		return o.call.err
	}
	return o.err
}

func (o *op) status() C.int {
	switch {
	case !o.done():
		return statusPending
	case o.failure() != nil:
		return statusFailed
	}
	return statusOK
}

// wait waits up to d for o, driving the engine meanwhile when o is a collective.
func (o *op) wait(d time.Duration) {
	if d <= 0 || o.done() {
		return
	}
	if o.call != nil {
		t := time.NewTimer(d)
		select {
		case <-o.call.done:
		case <-t.C:
		}
		t.Stop()
		return
	}
	ctx := sliceCtx{deadline: time.Now().Add(d)}
	_ = o.h.Wait(&ctx) // its error, if any, is the op's (kolo_error) or the timeout (status says)
	ctx.stop()
}

// sliceCtx is the context of one wait slice: a deadline that arms a timer only when the wait
// asks for its Done channel, which the engine's driver does only before it sleeps. A small op
// completes while its waiter spins, and context.WithTimeout's timer and allocations were a tenth
// of it.
type sliceCtx struct {
	deadline time.Time
	mu       sync.Mutex
	done     chan struct{} // made on the first Done, or when Err finds the deadline passed
	timer    *time.Timer
	err      error
}

func (c *sliceCtx) Deadline() (time.Time, bool) { return c.deadline, true }
func (c *sliceCtx) Value(any) any               { return nil }

func (c *sliceCtx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		c.done = make(chan struct{})
		if d := time.Until(c.deadline); d > 0 {
			c.timer = time.AfterFunc(d, c.expire)
		} else {
			c.expireLocked()
		}
	}
	return c.done
}

func (c *sliceCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil && !time.Now().Before(c.deadline) {
		if c.done == nil {
			c.done = make(chan struct{})
		}
		c.expireLocked() // before its timer fires: Done closes with the error
	}
	return c.err
}

func (c *sliceCtx) expire() {
	c.mu.Lock()
	c.expireLocked()
	c.mu.Unlock()
}

func (c *sliceCtx) expireLocked() {
	if c.err == nil {
		c.err = context.DeadlineExceeded
		close(c.done)
	}
}

// stop releases the timer, if the wait armed one.
func (c *sliceCtx) stop() {
	c.mu.Lock()
	if c.timer != nil {
		c.timer.Stop()
	}
	c.mu.Unlock()
}

// handles maps the integer handles the caller holds to ops. Ids start at 1 and are never reused.
var handles = struct {
	sync.Mutex
	next int64
	m    map[int64]*op
}{m: map[int64]*op{}}

func addOp(o *op) int64 {
	handles.Lock()
	defer handles.Unlock()
	handles.next++
	handles.m[handles.next] = o
	return handles.next
}

func lookup(id int64) *op {
	handles.Lock()
	defer handles.Unlock()
	return handles.m[id]
}

func release(id int64) {
	handles.Lock()
	delete(handles.m, id)
	handles.Unlock()
}

// errUnknownHandle says a handle was never issued or was released already.
var errUnknownHandle = errors.New("unknown handle (never issued, or released already)")

// unknownHandle is the error for h, which is not a handle.
func unknownHandle(h C.int64_t) error {
	return fmt.Errorf("handle %d: %w", int64(h), errUnknownHandle)
}

// completed is the kolo handle of op h, which must have completed successfully and be a
// collective or process-set change (init and shutdown have no result to read).
func completed(h C.int64_t) (*kolo.Handle, error) {
	o := lookup(int64(h))
	if o == nil {
		return nil, unknownHandle(h)
	}
	switch st := o.status(); {
	case st == statusPending:
		return nil, fmt.Errorf("handle %d: still running", int64(h))
	case st == statusFailed:
		return nil, fmt.Errorf("handle %d failed: %w", int64(h), o.failure())
	case o.h == nil:
		return nil, fmt.Errorf("handle %d has no result (it is an init or shutdown)", int64(h))
	}
	return o.h, nil
}

// issued returns the handle for o: negative when o failed at once (the caller raises at the call
// site, then releases it), positive otherwise.
func issued(o *op) C.int64_t {
	id := addOp(o)
	if o.done() && o.failure() != nil {
		return C.int64_t(-id)
	}
	return C.int64_t(id)
}

// options turns the scale factors and process set into kolo options.
func options(prescale, postscale float64, processSet, device int) ([]kolo.OpOption, error) {
	if err := notNegative("processSet", processSet); err != nil {
		return nil, err
	}
	var opts []kolo.OpOption
	if device >= 0 {
		opts = append(opts, kolo.FromGPU())
	}
	if processSet != 0 {
		opts = append(opts, kolo.InProcessSetID(processSet))
	}
	if prescale != 1 {
		opts = append(opts, kolo.Prescale(prescale))
	}
	if postscale != 1 {
		opts = append(opts, kolo.Postscale(postscale))
	}
	return opts, nil
}

// kolo_enqueue submits one op, described by the size bytes at rec (a kolo_op and the arrays that
// follow it), and returns its handle: positive, or negative when the op failed at once (kolo_error
// has why, a refused argument included; release it either way). in and out stay the caller's: they
// must live, untouched, until the handle completes. out is used by allreduce and broadcast (it may
// be in); allgather, alltoall and reducescatter allocate their result (kolo_result). nsplits -1
// (alltoall) splits evenly. reduceOp is horovod's numbering (Average=0, Sum=1, Adasum=2, Min=3,
// Max=4, Product=5) and must be one of them for every kind; barrier and join read no tensor, and
// ignore in, out, dt and shape. nameLen may be 0, for a name derived from what the op is. device is
// Horovod's: -1 for a tensor in host memory, else the GPU whose tensor the caller staged through in
// and out (every rank must agree on host or GPU; see kolo.FromGPU).
//
// waitUS 0 is an async call: the engine drives the op by itself if nobody waits on it soon. waitUS
// > 0 says the caller waits on the op at once (a synchronous call): the engine arms no timer to
// drive it, and kolo_enqueue waits up to waitUS microseconds for it, as kolo_wait does, saving the
// caller that call. An op that completed successfully in that time and has no result to fetch
// (allreduce, broadcast, barrier) returns 0: its handle is released already.
//
//export kolo_enqueue
func kolo_enqueue(rec unsafe.Pointer, size C.int) C.int64_t {
	a, err := opArgs(rec, int(size))
	if err != nil {
		return issued(&op{err: fmt.Errorf("kolo_enqueue: %w", err)})
	}
	o := enqueue(a)
	if a.waitUS > 0 {
		o.wait(time.Duration(a.waitUS) * time.Microsecond)
		if (a.kind == kindAllreduce || a.kind == kindBroadcast || a.kind == kindBarrier) && o.status() == statusOK {
			return 0
		}
	}
	return issued(o)
}

// opHeadBytes is the size of a kolo_op: where its arrays start.
const opHeadBytes = int(C.sizeof_kolo_op)

// opArgs reads the op block at p, size bytes: its kolo_op and, pointing into the block, its shape,
// splits and name.
func opArgs(p unsafe.Pointer, size int) (enqueueArgs, error) {
	block, err := cArray[byte]("rec", "size", p, size)
	if err != nil {
		return enqueueArgs{}, err
	}
	if size < opHeadBytes {
		return enqueueArgs{}, &argError{"size", whole, size, fmt.Sprintf("shorter than a kolo_op (%d bytes)", opHeadBytes)}
	}
	var h C.kolo_op
	copy(unsafe.Slice((*byte)(unsafe.Pointer(&h)), opHeadBytes), block) // the block need not be aligned
	a := enqueueArgs{
		kind: int(h.kind), in: h.in, out: h.out, dtype: int(h.dt), ndim: int(h.ndim), op: int(h.reduceOp),
		root: int(h.root), prescale: float64(h.prescale), postscale: float64(h.postscale),
		nsplits: int(h.nsplits), processSet: int(h.processSet), device: int(h.device), waitUS: int(h.waitUS),
		nameLen: int(h.nameLen),
	}
	for _, c := range []struct {
		arg string
		v   int
	}{{"ndim", a.ndim}, {"nameLen", a.nameLen}, {"waitUS", a.waitUS}} {
		if err := notNegative(c.arg, c.v); err != nil {
			return enqueueArgs{}, err
		}
	}
	if a.nsplits < -1 {
		return enqueueArgs{}, &argError{"nsplits", whole, a.nsplits, "negative (-1: no splits)"}
	}
	// Counts of int32 fields: these sums cannot overflow an int.
	shapeAt := opHeadBytes
	splitsAt := shapeAt + 8*a.ndim
	nameAt := splitsAt + 8*max(a.nsplits, 0)
	if end := nameAt + a.nameLen; end > size {
		return enqueueArgs{}, &argError{"size", whole, size, fmt.Sprintf("the op's shape, splits and name need %d", end)}
	}
	a.shape = unsafe.Add(p, shapeAt)
	if a.nsplits >= 0 {
		a.splits = unsafe.Add(p, splitsAt)
	}
	a.name = unsafe.Add(p, nameAt)
	return a, nil
}

// enqueueArgs are an op's arguments (kolo_op's fields), unchecked, in Go types, and where its
// tensors are.
type enqueueArgs struct {
	kind                int
	name                unsafe.Pointer
	nameLen             int
	in, out             unsafe.Pointer
	dtype               int
	shape               unsafe.Pointer
	ndim                int
	op, root            int
	prescale, postscale float64
	splits              unsafe.Pointer // nil: none (alltoall splits evenly)
	nsplits             int
	processSet          int
	device              int // in host memory: -1, else the GPU whose tensor was staged (kolo.FromGPU)
	waitUS              int // > 0: the caller waits on the handle at once (kolo.WaitsAtOnce)
	// onDevice: in and out are addresses on GPU device (kolo_enqueue_device), never read here,
	// and the op is ordered after the work on stream, the producer's cudaStream_t.
	onDevice bool
	stream   uintptr
}

// enqueue submits the op of a, in host or device memory alike: kolo_enqueue's and
// kolo_enqueue_device's one path. It converts the C arguments into Go values, refusing only what
// it cannot convert (a null pointer with a length, a negative count, memory past the end of the
// address space, a code that names nothing). What the op's arguments mean (a shape its kind
// cannot take, splits, a root, a device ordinal, scale factors) is kolo's to check, once for both
// memories: its refusal reaches the other ranks.
func enqueue(a enqueueArgs) *op {
	fn := "kolo_enqueue"
	if a.onDevice {
		fn = "kolo_enqueue_device"
	}
	name, err := cString("name", "nameLen", a.name, a.nameLen)
	if err != nil {
		return &op{err: fmt.Errorf("%s: %w", fn, err)}
	}
	fail := func(err error) *op { return &op{err: fmt.Errorf("%s %q: %w", fn, name, err)} }
	if err := cKind("kind", a.kind); err != nil {
		return fail(err)
	}
	reduceOp, err := cReduceOp("reduceOp", a.op)
	if err != nil {
		return fail(err)
	}
	staged := a.device
	if a.onDevice {
		staged = -1 // not staged: the device path's own
	}
	opts, err := options(a.prescale, a.postscale, a.processSet, staged)
	if err != nil {
		return fail(err)
	}
	if a.waitUS > 0 && !a.onDevice {
		opts = append(opts, kolo.WaitsAtOnce())
	}
	kind := kolo.OpKind(a.kind)
	var dt dtype.DType
	var shape, splits []int64
	if a.kind != kindBarrier && a.kind != kindJoin { // they read no tensor
		if dt, err = cDType("dt", whole, a.dtype); err != nil {
			return fail(err)
		}
		if shape, err = cInt64s("shape", "ndim", a.shape, a.ndim); err != nil {
			return fail(err)
		}
	}
	if a.kind == kindAlltoall && a.splits != nil {
		if splits, err = cInt64s("splits", "nsplits", a.splits, a.nsplits); err != nil {
			return fail(err)
		}
		if splits == nil {
			splits = []int64{} // zero ranks' worth, which kolo rejects with a message
		}
	}
	if a.onDevice {
		// A broadcast reads in on the root and writes out everywhere.
		in := kolo.DeviceTensor{Ptr: gpu.Ptr(uintptr(a.in)), DType: dt, Shape: shape}
		return &op{h: kolo.SubmitDevice(kind, name, in, gpu.Ptr(uintptr(a.out)), reduceOp, a.root, splits, a.device, a.stream, opts...)}
	}
	var t, o kolo.Tensor
	if a.kind != kindBarrier && a.kind != kindJoin {
		if t, err = cTensor("in", whole, a.in, dt, "shape", 0, shape); err != nil {
			return fail(err)
		}
		o = t
		if a.out != a.in && (a.kind == kindAllreduce || a.kind == kindBroadcast) {
			if o, err = cTensor("out", whole, a.out, dt, "shape", 0, shape); err != nil {
				return fail(err)
			}
		}
	}
	// A root outside the ranks is the engine's to refuse: as a refusal, the other ranks hear of it.
	switch a.kind {
	case kindAllreduce:
		return &op{h: kolo.AllreduceAsync(name, t, o, reduceOp, opts...)}
	case kindAllgather:
		return &op{h: kolo.AllgatherAsync(name, t, opts...)}
	case kindBroadcast:
		if a.out != a.in && len(t.Data) > 0 {
			copy(o.Data, t.Data) // broadcast works in place: out starts as this rank's input
		}
		return &op{h: kolo.BroadcastAsync(name, o, a.root, opts...)}
	case kindAlltoall:
		return &op{h: kolo.AlltoallAsync(name, t, splits, opts...)}
	case kindReduceScatter:
		return &op{h: kolo.ReduceScatterAsync(name, t, reduceOp, opts...)}
	case kindBarrier:
		return &op{h: kolo.BarrierAsync(opts...)}
	}
	return &op{h: kolo.JoinAsync()}
}

// kolo_refuse takes this rank's turn in an op that the binding's own checks refused before it
// could describe it to kolo_enqueue (an unsupported tensor type, splits of the wrong type): the
// other ranks' submissions of the op, kind and name (name may be empty for an unnamed op, which
// then uses up its number as kolo_enqueue would) in process set processSet, fail with reason.
// groupSize 0 refuses one op; n > 0, a grouped op of n members (kolo_enqueue_group's). It returns
// a handle that has failed with the reason (negative, as kolo_enqueue's for a refused op:
// kolo_error_kind says it is an argument error); release it.
//
//export kolo_refuse
func kolo_refuse(kind C.int, name *C.char, nameLen C.int, groupSize C.int, reason *C.char, reasonLen C.int, processSet C.int) C.int64_t {
	return issued(refuse(int(kind), unsafe.Pointer(name), int(nameLen), int(groupSize), unsafe.Pointer(reason), int(reasonLen), int(processSet)))
}

func refuse(kind int, namePtr unsafe.Pointer, nameLen, groupSize int, reasonPtr unsafe.Pointer, reasonLen int, processSet int) *op {
	name, err := cString("name", "nameLen", namePtr, nameLen)
	if err != nil {
		return &op{err: fmt.Errorf("kolo_refuse: %w", err)}
	}
	reason, err := cString("reason", "reasonLen", reasonPtr, reasonLen)
	if err == nil {
		err = cKind("kind", kind)
	}
	if err == nil {
		err = notNegative("groupSize", groupSize)
	}
	if err == nil {
		err = notNegative("processSet", processSet)
	}
	if err != nil {
		return &op{err: fmt.Errorf("kolo_refuse %q: %w", name, err)}
	}
	if reason == "" {
		reason = "refused"
	}
	var opts []kolo.OpOption
	if processSet != 0 {
		opts = append(opts, kolo.InProcessSetID(processSet))
	}
	if groupSize == 0 {
		return &op{h: kolo.RefuseAsync(kolo.OpKind(kind), name, errors.New(reason), opts...)}
	}
	// The caller holds one handle for the group, as for kolo_enqueue_group's first member; the
	// others fail alike.
	hs := kolo.RefuseGroupAsync(kolo.OpKind(kind), name, groupSize, errors.New(reason), opts...)
	return &op{h: hs[0]}
}

// kolo_enqueue_group submits n ops of one kind (allreduce, allgather or reducescatter) that every
// rank releases together (horovod's grouped ops), writing their handles into handles[0..n). Member i
// reads ins[i], of dtypes[i] and shape shapes[off_i .. off_i+ndims[i]) (the shapes concatenated),
// and, for allreduce, writes outs[i]. It returns 0, or -1 when the group failed at once: then every
// handle carries the error. With no handles to carry it (n negative, or handles null) it returns
// -1 with the error in kolo_last_error.
//
// stream -1: ins and outs are host memory, as kolo_enqueue's (device says whose GPU tensors they
// were staged from, -1 for none). Else they are device addresses on GPU device and the group goes
// to the device path as one, ordered after stream (the producer's cudaStream_t), each member as
// kolo_enqueue_device's op (a device allgather's or reducescatter's result is
// kolo_device_result's); when the device path cannot run a member, every handle fails with
// kolo_error_kind errorUnavailable and nothing is submitted: the binding stages the group.
//
//export kolo_enqueue_group
func kolo_enqueue_group(kind C.int, name *C.char, nameLen C.int, n C.int, ins, outs *unsafe.Pointer,
	dtypes *C.int, shapes *C.int64_t, ndims *C.int, reduceOp C.int, prescale, postscale C.double,
	processSet C.int, device C.int, stream C.int64_t, handles *C.int64_t) C.int {
	dst, err := cArray[C.int64_t]("handles", "n", unsafe.Pointer(handles), int(n))
	if err != nil {
		return setLastErr(fmt.Errorf("kolo_enqueue_group: %w", err))
	}
	ops := enqueueGroup(groupArgs{
		kind: int(kind), name: unsafe.Pointer(name), nameLen: int(nameLen), n: int(n),
		ins: unsafe.Pointer(ins), outs: unsafe.Pointer(outs), dtypes: unsafe.Pointer(dtypes),
		shapes: unsafe.Pointer(shapes), ndims: unsafe.Pointer(ndims), op: int(reduceOp),
		prescale: float64(prescale), postscale: float64(postscale), processSet: int(processSet),
		device: int(device), stream: int64(stream),
	})
	status := C.int(0)
	for i, o := range ops {
		dst[i] = issued(o)
		if dst[i] < 0 {
			status = -1
		}
	}
	return status
}

// groupArgs are kolo_enqueue_group's arguments, unchecked, in Go types (the handles excepted).
type groupArgs struct {
	kind                  int
	name                  unsafe.Pointer
	nameLen, n            int
	ins, outs             unsafe.Pointer // n pointers each
	dtypes, shapes, ndims unsafe.Pointer // n C ints, sum(ndims) int64s, n C ints
	op                    int
	prescale, postscale   float64
	processSet            int
	device                int   // as kolo_enqueue's, for every member
	stream                int64 // hostMemory, or the producer's stream of a group on the device path
}

// hostMemory is kolo_enqueue_group's stream for a group in host memory.
const hostMemory = -1

// enqueueGroup returns the group's n ops (n >= 0): all of them failed with one error when an
// argument was refused, since the other members would wait for a malformed one forever.
func enqueueGroup(a groupArgs) []*op {
	ops := make([]*op, a.n)
	name, err := cString("name", "nameLen", a.name, a.nameLen)
	fail := func(err error) []*op {
		for i := range ops {
			ops[i] = &op{err: fmt.Errorf("kolo_enqueue_group %q: %w", name, err)}
		}
		return ops
	}
	if err != nil {
		return fail(err)
	}
	switch a.kind {
	case kindAllreduce, kindAllgather, kindReduceScatter:
	default:
		if err := cKind("kind", a.kind); err != nil {
			return fail(err)
		}
		return fail(&argError{"kind", whole, a.kind, "cannot be grouped (allreduce 1, allgather 2 and reducescatter 5 can)"})
	}
	reduceOp, err := cReduceOp("reduceOp", a.op)
	if err != nil {
		return fail(err)
	}
	onDevice := a.stream != hostMemory
	if a.stream < hostMemory {
		return fail(&argError{"stream", whole, a.stream, "negative (-1: host memory)"})
	}
	staged := a.device
	if onDevice {
		staged = -1 // not staged: the device path's own
	}
	opts, err := options(a.prescale, a.postscale, a.processSet, staged)
	if err != nil {
		return fail(err)
	}
	inPtrs, err := cArray[unsafe.Pointer]("ins", "n", a.ins, a.n)
	if err != nil {
		return fail(err)
	}
	var outPtrs []unsafe.Pointer
	if a.kind == kindAllreduce {
		if outPtrs, err = cArray[unsafe.Pointer]("outs", "n", a.outs, a.n); err != nil {
			return fail(err)
		}
	}
	dts, err := cArray[int32]("dtypes", "n", a.dtypes, a.n)
	if err != nil {
		return fail(err)
	}
	nds, err := cArray[int32]("ndims", "n", a.ndims, a.n)
	if err != nil {
		return fail(err)
	}
	total := 0
	for i, d := range nds {
		if d < 0 {
			return fail(&argError{"ndims", i, d, "negative"})
		}
		total += int(d)
	}
	all, err := cInt64s("shapes", "sum of ndims", a.shapes, total)
	if err != nil {
		return fail(err)
	}
	tin := make([]kolo.Tensor, a.n)
	tout := make([]kolo.Tensor, a.n)
	var din []kolo.DeviceTensor
	var dout []gpu.Ptr
	if onDevice {
		din, dout = make([]kolo.DeviceTensor, a.n), make([]gpu.Ptr, a.n)
	}
	off := 0
	for i := range a.n {
		first := off
		off += int(nds[i])
		shape := all[first:off:off]
		dt, err := cDType("dtypes", i, int(dts[i]))
		if err != nil {
			return fail(err)
		}
		if onDevice {
			// Device addresses, never read here (an empty CUDA tensor's may be 0): kolo checks
			// the shape, as kolo_enqueue_device's.
			din[i] = kolo.DeviceTensor{Ptr: gpu.Ptr(uintptr(inPtrs[i])), DType: dt, Shape: shape}
			if outPtrs != nil {
				dout[i] = gpu.Ptr(uintptr(outPtrs[i]))
			}
			continue
		}
		if tin[i], err = cTensor("ins", i, inPtrs[i], dt, "shapes", first, shape); err != nil {
			return fail(fmt.Errorf("tensor %d: %w", i, err))
		}
		tout[i] = tin[i]
		if a.kind == kindAllreduce && outPtrs[i] != inPtrs[i] {
			if tout[i], err = cTensor("outs", i, outPtrs[i], dt, "shapes", first, shape); err != nil {
				return fail(fmt.Errorf("tensor %d: %w", i, err))
			}
		}
	}
	var hs []*kolo.Handle
	switch {
	case onDevice:
		if dout == nil {
			dout = make([]gpu.Ptr, a.n) // allgather, reducescatter: the engine allocates the results
		}
		hs = kolo.SubmitDeviceGroup(kolo.OpKind(a.kind), name, din, dout, reduceOp, a.device, uintptr(a.stream), opts...)
	case a.kind == kindAllreduce:
		hs = kolo.AllreduceGroupAsync(name, tin, tout, reduceOp, opts...)
	case a.kind == kindAllgather:
		hs = kolo.AllgatherGroupAsync(name, tin, opts...)
	case a.kind == kindReduceScatter:
		hs = kolo.ReduceScatterGroupAsync(name, tin, reduceOp, opts...)
	}
	for i, h := range hs {
		ops[i] = &op{h: h}
	}
	return ops
}

// Results of kolo_poll and kolo_wait, and every function that reads a completed op, are -1 for an
// unknown handle or a refused argument, with why in kolo_last_error.

// unknown records that h is not a handle, for kolo_last_error, and returns -1.
func unknown(fn string, h C.int64_t) C.int {
	return setLastErr(fmt.Errorf("%s: %w", fn, unknownHandle(h)))
}

// kolo_poll is 1 when the op completed successfully, 2 when it failed, 0 while it runs, -1 for an
// unknown handle.
//
//export kolo_poll
func kolo_poll(h C.int64_t) C.int {
	o := lookup(int64(h))
	if o == nil {
		return unknown("kolo_poll", h)
	}
	return o.status()
}

// kolo_wait waits up to timeoutUS microseconds (>= 0) for the op, driving the engine meanwhile, and
// returns what kolo_poll would. Callers loop on short waits, so that a signal (Ctrl-C in Python)
// is handled between calls; an op that completes within the wait returns at once. With releaseOK
// set, a handle that completed successfully is released (saving a call when there is no result to
// fetch).
//
//export kolo_wait
func kolo_wait(h C.int64_t, timeoutUS C.int64_t, releaseOK C.int) C.int {
	if err := notNegative("timeoutUS", int64(timeoutUS)); err != nil {
		return setLastErr(fmt.Errorf("kolo_wait: %w", err))
	}
	o := lookup(int64(h))
	if o == nil {
		return unknown("kolo_wait", h)
	}
	d := time.Duration(math.MaxInt64)
	if int64(timeoutUS) < int64(d/time.Microsecond) {
		d = time.Duration(timeoutUS) * time.Microsecond
	}
	o.wait(d)
	st := o.status()
	if st == statusOK && releaseOK != 0 {
		release(int64(h))
	}
	return st
}

// kolo_error writes the failed op's error into buf and returns its length (0 while the op runs
// or when it succeeded, -1 for an unknown handle or a bad buffer).
//
//export kolo_error
func kolo_error(h C.int64_t, buf *C.char, capacity C.int) C.int {
	o := lookup(int64(h))
	if o == nil {
		return unknown("kolo_error", h)
	}
	msg := ""
	if o.status() == statusFailed {
		msg = o.failure().Error()
	}
	n, err := putString(msg, buf, capacity)
	if err != nil {
		return setLastErr(fmt.Errorf("kolo_error: %w", err))
	}
	return n
}

// Error kinds, as kolo_error_kind returns them (errorUnavailable, 3, is in device.go).
const (
	errorNone     = 0 // the op runs, or succeeded
	errorFailed   = 1 // the op failed: a lost rank, a rank that ended or stalled, a shutdown
	errorArgument = 2 // this rank refused the op's arguments before it ran (kolo.ArgumentError)
	errorMismatch = 4 // the ranks disagreed on the op, or could not run it as submitted (kolo.ErrMismatch)
)

// kolo_error_kind says how the op failed (errorNone, errorFailed, errorArgument, errorUnavailable
// or errorMismatch), so that the caller can raise what Horovod raises (ValueError for a refused
// argument, HorovodInternalError for a failed op; horovod.tensorflow a precondition error for a
// mismatch); -1 for an unknown handle.
//
//export kolo_error_kind
func kolo_error_kind(h C.int64_t) C.int {
	o := lookup(int64(h))
	if o == nil {
		return unknown("kolo_error_kind", h)
	}
	if o.status() != statusFailed {
		return errorNone
	}
	var ae *kolo.ArgumentError
	if errors.Is(o.failure(), kolo.ErrDeviceUnavailable) {
		return errorUnavailable // a device op to stage (capi/device.go)
	}
	if o.err != nil || errors.As(o.failure(), &ae) {
		return errorArgument
	}
	if errors.Is(o.failure(), kolo.ErrMismatch) {
		return errorMismatch
	}
	return errorFailed
}

// kolo_result writes the shape of a completed allgather, alltoall or reducescatter result into
// shape (ndim entries, at least the result's rank, which is the input's; shape may be NULL with
// ndim 0) and returns its size in bytes; -1 for an unknown handle, an op not completed
// successfully or a bad argument.
//
//export kolo_result
func kolo_result(h C.int64_t, shape *C.int64_t, ndim C.int) C.int64_t {
	kh, err := completed(h)
	if err != nil {
		return C.int64_t(setLastErr(fmt.Errorf("kolo_result: %w", err)))
	}
	t := kh.Tensor()
	dst, err := cArray[int64]("shape", "ndim", unsafe.Pointer(shape), int(ndim))
	if err == nil && dst != nil && len(dst) < len(t.Shape) {
		err = &argError{"ndim", whole, int(ndim), fmt.Sprintf("the result has %d dimensions", len(t.Shape))}
	}
	if err != nil {
		return C.int64_t(setLastErr(fmt.Errorf("kolo_result: %w", err)))
	}
	copy(dst, t.Shape)
	return C.int64_t(len(t.Data))
}

// kolo_result_copy copies the result of a completed op into dst, which must hold exactly nbytes
// (kolo_result's size); it returns nbytes, or -1.
//
//export kolo_result_copy
func kolo_result_copy(h C.int64_t, dst unsafe.Pointer, nbytes C.int64_t) C.int64_t {
	kh, err := completed(h)
	if err != nil {
		return C.int64_t(setLastErr(fmt.Errorf("kolo_result_copy: %w", err)))
	}
	data := kh.Tensor().Data
	if int64(nbytes) != int64(len(data)) {
		return C.int64_t(setLastErr(fmt.Errorf("kolo_result_copy: %w",
			&argError{"nbytes", whole, int64(nbytes), fmt.Sprintf("the result has %d bytes", len(data))})))
	}
	out, err := cArray[byte]("dst", "nbytes", dst, len(data))
	if err != nil {
		return C.int64_t(setLastErr(fmt.Errorf("kolo_result_copy: %w", err)))
	}
	copy(out, data)
	return nbytes
}

// kolo_recv_splits copies, for a completed alltoall, the rows received from each rank into dst
// (up to n; dst may be NULL with n 0) and returns how many ranks there are; -1 for an unknown
// handle, an op not completed successfully or a bad argument.
//
//export kolo_recv_splits
func kolo_recv_splits(h C.int64_t, dst *C.int64_t, n C.int) C.int {
	kh, err := completed(h)
	if err != nil {
		return setLastErr(fmt.Errorf("kolo_recv_splits: %w", err))
	}
	out, err := cArray[int64]("dst", "n", unsafe.Pointer(dst), int(n))
	if err != nil {
		return setLastErr(fmt.Errorf("kolo_recv_splits: %w", err))
	}
	splits := kh.RecvSplits()
	copy(out, splits)
	return C.int(len(splits))
}

// kolo_join_last is, for a completed join, the last rank to join; -1 otherwise.
//
//export kolo_join_last
func kolo_join_last(h C.int64_t) C.int {
	kh, err := completed(h)
	if err != nil {
		return setLastErr(fmt.Errorf("kolo_join_last: %w", err))
	}
	return C.int(kh.JoinLast())
}

// kolo_release forgets a handle and the result it holds. Releasing an op still in flight is
// allowed (the caller must keep its tensors alive until it completes anyway); the op completes
// unobserved.
//
//export kolo_release
func kolo_release(h C.int64_t) { release(int64(h)) }

// kolo_handles is the number of handles not yet released (tests check that nothing leaks).
//
//export kolo_handles
func kolo_handles() C.int {
	handles.Lock()
	defer handles.Unlock()
	return C.int(len(handles.m))
}
