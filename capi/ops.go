package main

/*
#include <stdint.h>
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
	"github.com/kolo-dl/kolo/dtype"
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
	statusUnknown = -1 // no such handle (never issued, or released)
	statusPending = 0
	statusOK      = 1
	statusFailed  = 2
)

// op is one entry of the handle table: an op in flight or completed, until the caller releases it.
type op struct {
	h   *kolo.Handle
	err error // the arguments were rejected here, before reaching kolo (h is nil)
}

func (o *op) done() bool { return o.h == nil || o.h.Poll() }

func (o *op) failure() error {
	if o.h == nil {
		return o.err
	}
	return o.h.Err()
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

func lookup(h C.int64_t) *op {
	handles.Lock()
	defer handles.Unlock()
	return handles.m[int64(h)]
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

// view is the caller's memory at p as n bytes (nil p only for empty tensors).
func view(p unsafe.Pointer, n int64) ([]byte, error) {
	if n == 0 {
		return []byte{}, nil
	}
	if p == nil {
		return nil, fmt.Errorf("null data pointer for %d bytes", n)
	}
	return unsafe.Slice((*byte)(p), n), nil
}

// int64s copies n int64s from C memory: kolo keeps shapes and splits after the call returns.
func int64s(p *C.int64_t, n C.int) []int64 {
	if p == nil || n <= 0 {
		return nil
	}
	return append([]int64(nil), unsafe.Slice((*int64)(unsafe.Pointer(p)), int(n))...)
}

// tensor builds a kolo.Tensor over the caller's memory. Malformed shapes are left for kolo's checks
// to report, with an empty view so that no slice ever claims more memory than the tensor has.
func tensor(p unsafe.Pointer, dt dtype.DType, shape []int64) (kolo.Tensor, error) {
	t := kolo.Tensor{DType: dt, Shape: shape}
	if t.Shape == nil {
		t.Shape = []int64{}
	}
	n := int64(t.DType.Size())
	for _, d := range t.Shape {
		if d < 0 || (d > 0 && n > math.MaxInt64/d) {
			n = 0
			break
		}
		n *= d
	}
	if t.DType.Size() == 0 || n == 0 && t.NumElements() != 0 {
		t.Data = []byte{}
		return t, nil
	}
	var err error
	t.Data, err = view(p, n)
	return t, err
}

// options turns the scale factors and process set into kolo options.
func options(prescale, postscale C.double, processSet C.int) ([]kolo.OpOption, error) {
	var opts []kolo.OpOption
	if processSet != 0 {
		opts = append(opts, kolo.InProcessSetID(int(processSet)))
	}
	if prescale != 1 {
		opts = append(opts, kolo.Prescale(float64(prescale)))
	}
	if postscale != 1 {
		opts = append(opts, kolo.Postscale(float64(postscale)))
	}
	return opts, nil
}

// kolo_enqueue submits one op and returns its handle: positive, or negative when the op failed at
// once (kolo_error has why; release it either way). in and out stay the caller's: they must live,
// untouched, until the handle completes. out is used by allreduce and broadcast (it may be in);
// allgather, alltoall and reducescatter allocate their result (kolo_result). splits (alltoall) may
// be null for an even split. op is horovod's numbering (Average=0, Sum=1, Min=3, Max=4,
// Product=5); name may be empty, for a name derived from what the op is.
//
//export kolo_enqueue
func kolo_enqueue(kind C.int, name *C.char, nameLen C.int, in, out unsafe.Pointer, dt C.int,
	shape *C.int64_t, ndim C.int, reduceOp C.int, root C.int, prescale, postscale C.double,
	splits *C.int64_t, nsplits C.int, processSet C.int) C.int64_t {
	o := enqueue(int(kind), goName(name, nameLen), in, out, dt, int64s(shape, ndim), kolo.Op(reduceOp),
		int(root), prescale, postscale, int64s(splits, nsplits), splits != nil, processSet)
	return issued(o)
}

func goName(p *C.char, n C.int) string {
	if p == nil || n <= 0 {
		return ""
	}
	return C.GoStringN(p, n)
}

func enqueue(kind int, name string, in, out unsafe.Pointer, dt C.int, shape []int64, reduceOp kolo.Op,
	root int, prescale, postscale C.double, splits []int64, haveSplits bool, processSet C.int) *op {
	opts, err := options(prescale, postscale, processSet)
	if err != nil {
		return &op{err: err}
	}
	var t, o kolo.Tensor
	if kind != kindBarrier && kind != kindJoin {
		if t, err = tensor(in, dtype.DType(dt), shape); err != nil {
			return &op{err: fmt.Errorf("%q input: %w", name, err)}
		}
		o = t
		if out != in && (kind == kindAllreduce || kind == kindBroadcast) {
			if o, err = tensor(out, dtype.DType(dt), shape); err != nil {
				return &op{err: fmt.Errorf("%q output: %w", name, err)}
			}
		}
	}
	switch kind {
	case kindAllreduce:
		return &op{h: kolo.AllreduceAsync(name, t, o, reduceOp, opts...)}
	case kindAllgather:
		return &op{h: kolo.AllgatherAsync(name, t, opts...)}
	case kindBroadcast:
		if out != in && len(t.Data) > 0 {
			copy(o.Data, t.Data) // broadcast works in place: out starts as this rank's input
		}
		return &op{h: kolo.BroadcastAsync(name, o, root, opts...)}
	case kindAlltoall:
		if haveSplits && splits == nil {
			splits = []int64{} // zero ranks' worth, which kolo rejects with a message
		}
		return &op{h: kolo.AlltoallAsync(name, t, splits, opts...)}
	case kindReduceScatter:
		return &op{h: kolo.ReduceScatterAsync(name, t, reduceOp, opts...)}
	case kindBarrier:
		return &op{h: kolo.BarrierAsync(opts...)}
	case kindJoin:
		return &op{h: kolo.JoinAsync()}
	}
	return &op{err: fmt.Errorf("unknown op kind %d", kind)}
}

// kolo_enqueue_group submits n ops of one kind (allreduce, allgather or reducescatter) that every
// rank releases together (horovod's grouped ops), writing their handles into handles[0..n). Member i
// reads ins[i], of dtypes[i] and shape shapes[off_i .. off_i+ndims[i]) (the shapes concatenated),
// and, for allreduce, writes outs[i]. It returns 0, or -1 when the group failed at once: then every
// handle carries the error.
//
//export kolo_enqueue_group
func kolo_enqueue_group(kind C.int, name *C.char, nameLen C.int, n C.int, ins, outs *unsafe.Pointer,
	dtypes *C.int, shapes *C.int64_t, ndims *C.int, reduceOp C.int, prescale, postscale C.double,
	processSet C.int, handles *C.int64_t) C.int {
	if n <= 0 {
		return 0
	}
	ops := enqueueGroup(int(kind), goName(name, nameLen), int(n), ins, outs, dtypes, shapes, ndims,
		kolo.Op(reduceOp), prescale, postscale, processSet)
	dst := unsafe.Slice((*C.int64_t)(unsafe.Pointer(handles)), int(n))
	status := C.int(0)
	for i, o := range ops {
		dst[i] = issued(o)
		if dst[i] < 0 {
			status = -1
		}
	}
	return status
}

func enqueueGroup(kind int, name string, n int, ins, outs *unsafe.Pointer, dtypes *C.int,
	shapes *C.int64_t, ndims *C.int, reduceOp kolo.Op, prescale, postscale C.double, processSet C.int) []*op {
	ops := make([]*op, n)
	fail := func(err error) []*op {
		for i := range ops {
			ops[i] = &op{err: err}
		}
		return ops
	}
	opts, err := options(prescale, postscale, processSet)
	if err != nil {
		return fail(err)
	}
	if ins == nil || dtypes == nil || ndims == nil || (kind == kindAllreduce && outs == nil) {
		return fail(errors.New("grouped op: null argument array"))
	}
	inPtrs := unsafe.Slice(ins, n)
	var outPtrs []unsafe.Pointer
	if outs != nil {
		outPtrs = unsafe.Slice(outs, n)
	}
	dts := unsafe.Slice(dtypes, n)
	nds := unsafe.Slice(ndims, n)
	total := 0
	for _, d := range nds {
		total += int(d)
	}
	var all []int64
	if total > 0 {
		all = unsafe.Slice((*int64)(unsafe.Pointer(shapes)), total)
	}
	tin := make([]kolo.Tensor, n)
	tout := make([]kolo.Tensor, n)
	off := 0
	for i := range n {
		shape := append([]int64{}, all[off:off+int(nds[i])]...)
		off += int(nds[i])
		if tin[i], err = tensor(inPtrs[i], dtype.DType(dts[i]), shape); err != nil {
			return fail(fmt.Errorf("grouped op %q, tensor %d input: %w", name, i, err))
		}
		tout[i] = tin[i]
		if kind == kindAllreduce && outPtrs[i] != inPtrs[i] {
			if tout[i], err = tensor(outPtrs[i], dtype.DType(dts[i]), shape); err != nil {
				return fail(fmt.Errorf("grouped op %q, tensor %d output: %w", name, i, err))
			}
		}
	}
	var hs []*kolo.Handle
	switch kind {
	case kindAllreduce:
		hs = kolo.AllreduceGroupAsync(name, tin, tout, reduceOp, opts...)
	case kindAllgather:
		hs = kolo.AllgatherGroupAsync(name, tin, opts...)
	case kindReduceScatter:
		hs = kolo.ReduceScatterGroupAsync(name, tin, reduceOp, opts...)
	default:
		return fail(fmt.Errorf("grouped op %q: kind %d cannot be grouped (allreduce, allgather and reducescatter can)", name, kind))
	}
	for i, h := range hs {
		ops[i] = &op{h: h}
	}
	return ops
}

// kolo_poll is 1 when the op completed successfully, 2 when it failed, 0 while it runs, -1 for an
// unknown handle.
//
//export kolo_poll
func kolo_poll(h C.int64_t) C.int {
	o := lookup(h)
	if o == nil {
		return statusUnknown
	}
	return o.status()
}

// kolo_wait waits up to timeoutUS microseconds for the op, driving the engine meanwhile, and
// returns what kolo_poll would. Callers loop on short waits, so that a signal (Ctrl-C in Python)
// is handled between calls; an op that completes within the wait returns at once. With release
// set, a handle that completed successfully is released (saving a call when there is no result
// to fetch).
//
//export kolo_wait
func kolo_wait(h C.int64_t, timeoutUS C.int64_t, release C.int) C.int {
	o := lookup(h)
	if o == nil {
		return statusUnknown
	}
	if !o.done() && timeoutUS > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(timeoutUS)*time.Microsecond)
		_ = o.h.Wait(ctx) // its error, if any, is the op's (kolo_error) or the timeout (status says)
		cancel()
	}
	st := o.status()
	if st == statusOK && release != 0 {
		kolo_release(h)
	}
	return st
}

// kolo_error writes the failed op's error into buf and returns its length (0 while the op runs
// or when it succeeded, -1 for an unknown handle).
//
//export kolo_error
func kolo_error(h C.int64_t, buf *C.char, capacity C.int) C.int {
	o := lookup(h)
	if o == nil {
		return statusUnknown
	}
	if !o.done() || o.failure() == nil {
		return 0
	}
	return putString(o.failure().Error(), buf, capacity)
}

// kolo_result writes the shape of a completed allgather, alltoall or reducescatter result into
// shape (ndim entries: the input's rank) and returns its size in bytes; -1 for an unknown handle or
// an op not completed successfully.
//
//export kolo_result
func kolo_result(h C.int64_t, shape *C.int64_t, ndim C.int) C.int64_t {
	o := lookup(h)
	if o == nil || o.status() != statusOK {
		return -1
	}
	t := o.h.Tensor()
	if shape != nil && ndim > 0 {
		dst := unsafe.Slice((*int64)(unsafe.Pointer(shape)), int(ndim))
		copy(dst, t.Shape)
	}
	return C.int64_t(len(t.Data))
}

// kolo_result_copy copies the result of a completed op into dst, which must hold exactly nbytes
// (kolo_result's size); it returns nbytes, or -1.
//
//export kolo_result_copy
func kolo_result_copy(h C.int64_t, dst unsafe.Pointer, nbytes C.int64_t) C.int64_t {
	o := lookup(h)
	if o == nil || o.status() != statusOK {
		return -1
	}
	data := o.h.Tensor().Data
	if int64(len(data)) != int64(nbytes) {
		return -1
	}
	if len(data) > 0 {
		copy(unsafe.Slice((*byte)(dst), len(data)), data)
	}
	return nbytes
}

// kolo_recv_splits copies, for a completed alltoall, the rows received from each rank into dst
// (up to n) and returns how many ranks there are; -1 for an unknown handle or an op not completed
// successfully.
//
//export kolo_recv_splits
func kolo_recv_splits(h C.int64_t, dst *C.int64_t, n C.int) C.int {
	o := lookup(h)
	if o == nil || o.status() != statusOK {
		return -1
	}
	splits := o.h.RecvSplits()
	if dst != nil && n > 0 {
		copy(unsafe.Slice((*int64)(unsafe.Pointer(dst)), int(n)), splits)
	}
	return C.int(len(splits))
}

// kolo_join_last is, for a completed join, the last rank to join; -1 otherwise.
//
//export kolo_join_last
func kolo_join_last(h C.int64_t) C.int {
	o := lookup(h)
	if o == nil || o.status() != statusOK {
		return -1
	}
	return C.int(o.h.JoinLast())
}

// kolo_release forgets a handle and the result it holds. Releasing an op still in flight is
// allowed (the caller must keep its tensors alive until it completes anyway); the op completes
// unobserved.
//
//export kolo_release
func kolo_release(h C.int64_t) {
	handles.Lock()
	delete(handles.m, int64(h))
	handles.Unlock()
}

// kolo_handles is the number of handles not yet released (tests check that nothing leaks).
//
//export kolo_handles
func kolo_handles() C.int {
	handles.Lock()
	defer handles.Unlock()
	return C.int(len(handles.m))
}
