package main

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/kolo-dl/kolo"
	"github.com/kolo-dl/kolo/internal/dtype"
)

// lastError is what kolo_last_error would return on this thread: a test that reads it locks its
// goroutine to its thread first (lockThread), as a C caller is.
func lastError() string { return threadLastErr() }

// lockThread keeps the test's goroutine on one OS thread, so that its calls and lastError see one
// thread's error, as a C caller's do.
func lockThread(t *testing.T) {
	runtime.LockOSThread()
	t.Cleanup(runtime.UnlockOSThread)
}

// handleError is the error of the op of handle h, which must have failed at once (h < 0); it
// releases the handle.
func handleError(t *testing.T, h int64) string {
	t.Helper()
	if h >= 0 {
		t.Fatalf("handle %d, want a negative one (failed at once)", h)
	}
	defer release(-h)
	o := lookup(-h)
	if o == nil || !o.done() || o.failure() == nil {
		t.Fatalf("handle %d has no error", -h)
	}
	return o.failure().Error()
}

// Every exported function, called with the null pointers, negative counts and unknown codes a C
// caller could pass, returns its ordinary error naming the argument and its value: before these
// checks several of them panicked, and a Go panic in a c-shared library kills Python.
func TestExportedFunctionsRefuseBadArguments(t *testing.T) {
	lockThread(t)
	for _, tc := range []struct {
		name   string
		handle bool // the call returns a handle that must have failed at once; else -1 and kolo_last_error
		call   func() int64
		want   string
	}{
		{"kolo_version null buffer", false, func() int64 { return int64(kolo_version(nil, 8)) }, "argument buf = NULL"},
		{"kolo_version negative capacity", false, func() int64 { return int64(kolo_version(nil, -1)) }, "argument capacity = -1"},
		{"kolo_abort null reason", false, func() int64 { return int64(kolo_abort(nil, 5)) }, "kolo_abort: argument reason = NULL"},
		{"kolo_abort negative length", false, func() int64 { return int64(kolo_abort(nil, -3)) }, "argument length = -3"},
		// The export converts and forwards its C arguments to enqueue (whose checks
		// TestEnqueueRefusesBadArguments covers) and returns the failed op's handle, negative. 263
		// is not float32's 7 once truncated to a byte: the C int reaches the check whole.
		{"kolo_enqueue forwards and returns a negative handle", true, func() int64 {
			b := opBlock(testOp{kind: 1, dt: 256 + 7, reduceOp: 1, prescale: 1, postscale: 1, device: -1}, nil, nil, "")
			return enqueueBlock(b, len(b))
		}, "argument dt = 263"},
		{"kolo_enqueue null block", true, func() int64 { return int64(kolo_enqueue(nil, 72)) }, "kolo_enqueue: argument rec = NULL"},
		{"kolo_enqueue_group null handles", false, func() int64 {
			return int64(kolo_enqueue_group(1, nil, 0, 2, nil, nil, nil, nil, nil, 1, 1, 1, 0, -1, -1, nil))
		}, "kolo_enqueue_group: argument handles = NULL"},
		{"kolo_enqueue_group negative count", false, func() int64 {
			return int64(kolo_enqueue_group(1, nil, 0, -1, nil, nil, nil, nil, nil, 1, 1, 1, 0, -1, -1, nil))
		}, "argument n = -1"},
		{"kolo_poll unknown handle", false, func() int64 { return int64(kolo_poll(1 << 40)) }, "handle 1099511627776: unknown"},
		{"kolo_wait negative timeout", false, func() int64 { return int64(kolo_wait(1, -5, 0)) }, "argument timeoutUS = -5"},
		{"kolo_error unknown handle", false, func() int64 { return int64(kolo_error(1<<40, nil, 0)) }, "unknown handle"},
		{"kolo_result unknown handle", false, func() int64 { return int64(kolo_result(1<<40, nil, 0)) }, "kolo_result: handle 1099511627776: unknown"},
		{"kolo_result_copy unknown handle", false, func() int64 { return int64(kolo_result_copy(1<<40, nil, 8)) }, "unknown"},
		{"kolo_recv_splits unknown handle", false, func() int64 { return int64(kolo_recv_splits(1<<40, nil, 0)) }, "unknown"},
		{"kolo_join_last unknown handle", false, func() int64 { return int64(kolo_join_last(1 << 40)) }, "unknown"},
		{"kolo_process_set_id unknown handle", false, func() int64 { return int64(kolo_process_set_id(1 << 40)) }, "unknown"},
		{"kolo_refuse unknown kind", true, func() int64 { return int64(kolo_refuse(9, nil, 0, 0, nil, 0, 0)) }, "argument kind = 9"},
		{"kolo_refuse negative group size", true, func() int64 { return int64(kolo_refuse(1, nil, 0, -2, nil, 0, 0)) }, "argument groupSize = -2"},
		{"kolo_refuse null reason", true, func() int64 { return int64(kolo_refuse(1, nil, 0, 0, nil, 5, 0)) }, "argument reason = NULL"},
		{"kolo_refuse negative process set", true, func() int64 { return int64(kolo_refuse(1, nil, 0, 0, nil, 0, -1)) }, "argument processSet = -1"},
		{"kolo_init_async null ranks", true, func() int64 { return int64(kolo_init_async(nil, 2)) }, "argument ranks = NULL"},
		{"kolo_add_process_set null ranks", true, func() int64 { return int64(kolo_add_process_set(nil, 3)) }, "argument ranks = NULL"},
		{"kolo_add_process_set negative count", true, func() int64 { return int64(kolo_add_process_set(nil, -1)) }, "argument n = -1"},
		{"kolo_remove_process_set negative id", true, func() int64 { return int64(kolo_remove_process_set(-1)) }, "argument id = -1"},
		{"kolo_process_set_ranks null dst", false, func() int64 { return int64(kolo_process_set_ranks(0, nil, 4)) }, "argument dst = NULL"},
		{"kolo_process_set_ranks negative count", false, func() int64 { return int64(kolo_process_set_ranks(0, nil, -4)) }, "argument n = -4"},
		{"kolo_start_timeline null path", false, func() int64 { return int64(kolo_start_timeline(nil, 5, 0)) }, "argument path = NULL"},
		{"kolo_start_timeline negative length", false, func() int64 { return int64(kolo_start_timeline(nil, -1, 0)) }, "argument pathLen = -1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lockThread(t) // a subtest runs on a goroutine of its own
			got := tc.call()
			var msg string
			if tc.handle {
				msg = handleError(t, got)
			} else {
				if got != -1 {
					t.Fatalf("returned %d, want -1", got)
				}
				msg = lastError()
			}
			if !strings.Contains(msg, tc.want) {
				t.Errorf("error %q, want it to contain %q", msg, tc.want)
			}
		})
	}
	if n := kolo_last_error(nil, -1); n != -1 {
		t.Errorf("kolo_last_error(NULL, -1) = %d, want -1", n)
	}
}

// tensor6 is a float32 tensor of shape [2 3] and that shape, for building valid arguments.
func tensor6() (unsafe.Pointer, []int64) {
	buf := make([]float32, 6)
	return unsafe.Pointer(&buf[0]), []int64{2, 3}
}

// kolo_enqueue's checks, through its Go-typed arguments (pointers a test can build): each case
// breaks one argument of a valid call.
func TestEnqueueRefusesBadArguments(t *testing.T) {
	p, shape := tensor6()
	name := []byte("grad")
	valid := func() enqueueArgs {
		return enqueueArgs{
			kind: kindAllreduce, name: unsafe.Pointer(&name[0]), nameLen: len(name), in: p, out: p,
			dtype: 7, shape: unsafe.Pointer(&shape[0]), ndim: len(shape), op: int(kolo.Sum),
			prescale: 1, postscale: 1,
		}
	}
	negative := []int64{-2, 3}
	huge := []int64{math.MaxInt64 / 2, 4}
	splits := []int64{1}
	nearTop := unsafe.Add(p, -int(uintptr(p))-8) // 8 bytes below the end of the address space
	for _, tc := range []struct {
		name  string
		spoil func(*enqueueArgs)
		want  string
	}{
		{"kind 0", func(a *enqueueArgs) { a.kind = 0 }, "argument kind = 0"},
		{"kind 8", func(a *enqueueArgs) { a.kind = 8 }, "argument kind = 8"},
		{"name length negative", func(a *enqueueArgs) { a.nameLen = -1 }, "argument nameLen = -1"},
		{"name null", func(a *enqueueArgs) { a.name = nil }, "argument name = NULL"},
		{"dtype 0", func(a *enqueueArgs) { a.dtype = 0 }, "argument dt = 0"},
		{"dtype negative", func(a *enqueueArgs) { a.dtype = -7 }, "argument dt = -7"},
		{"dtype past the last", func(a *enqueueArgs) { a.dtype = 10 }, "argument dt = 10"}, // 9 is int16
		{"dtype 263 (float32 + 256)", func(a *enqueueArgs) { a.dtype = 263 }, "argument dt = 263"},
		{"ndim negative", func(a *enqueueArgs) { a.ndim = -2 }, "argument ndim = -2"},
		{"shape null", func(a *enqueueArgs) { a.shape = nil }, "argument shape = NULL"},
		{"negative dimension", func(a *enqueueArgs) { a.shape = unsafe.Pointer(&negative[0]) }, "argument shape[0] = -2"},
		{"shape overflowing int64", func(a *enqueueArgs) { a.shape = unsafe.Pointer(&huge[0]) }, "argument shape = [4611686018427387903 4]"},
		{"op past the last", func(a *enqueueArgs) { a.op = 6 }, "argument reduceOp = 6"},
		{"op unknown", func(a *enqueueArgs) { a.op = -1 }, "argument reduceOp = -1"},
		{"process set negative", func(a *enqueueArgs) { a.processSet = -1 }, "argument processSet = -1"},
		{"process set negative for a barrier (which reads no tensor)", func(a *enqueueArgs) {
			a.kind, a.dtype, a.shape, a.processSet = kindBarrier, 0, nil, -2
		}, "argument processSet = -2"},
		{"input null", func(a *enqueueArgs) { a.in = nil }, "argument in = NULL"},
		{"output null", func(a *enqueueArgs) { a.out = nil }, "argument out = NULL"},
		{"input past the end of memory", func(a *enqueueArgs) { a.in, a.out = nearTop, nearTop }, "run past the end of the address space"},
		{"splits count negative", func(a *enqueueArgs) {
			a.kind, a.splits, a.nsplits = kindAlltoall, unsafe.Pointer(&splits[0]), -1
		}, "argument nsplits = -1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lockThread(t) // a subtest runs on a goroutine of its own
			a := valid()
			tc.spoil(&a)
			o := enqueue(a)
			var ae *argError
			if o.err == nil || !errors.As(o.err, &ae) {
				t.Fatalf("error %v, want an argument error", o.failure())
			}
			if !strings.Contains(o.err.Error(), tc.want) {
				t.Errorf("error %q, want it to contain %q", o.err, tc.want)
			}
		})
	}
	// The unbroken call passes the checks (and fails in kolo, not initialized here, or runs).
	if o := enqueue(valid()); o.err != nil {
		t.Errorf("valid arguments refused: %v", o.err)
	}
}

// Every dtype's C code is accepted as that dtype (int16, appended last, is 9), and the refusal
// lists them in code order.
func TestDTypeCodes(t *testing.T) {
	for _, d := range dtype.All {
		if got, err := cDType("dt", whole, int(d)); err != nil || got != d {
			t.Errorf("cDType(%d) = %v, %v; want %v", int(d), got, err, d)
		}
	}
	if got, err := cDType("dt", whole, 9); err != nil || got != dtype.Int16 {
		t.Errorf("cDType(9) = %v, %v; want int16", got, err)
	}
	const want = "1 uint8, 2 int8, 3 int32, 4 int64, 5 float16, 6 bfloat16, 7 float32, 8 float64, 9 int16"
	if dtypeCodes != want {
		t.Errorf("dtypeCodes = %q, want %q", dtypeCodes, want)
	}
}

// kolo_enqueue_group's checks: a refused argument fails every member with one error.
func TestEnqueueGroupRefusesBadArguments(t *testing.T) {
	p0, _ := tensor6()
	p1, _ := tensor6()
	ins := []unsafe.Pointer{p0, p1}
	outs := []unsafe.Pointer{p0, p1}
	withNil := []unsafe.Pointer{p0, nil}
	dtypes := []int32{7, 7}
	badDtypes := []int32{7, 99}
	ndims := []int32{2, 1}
	badNdims := []int32{2, -1}
	shapes := []int64{2, 3, 6}
	badShapes := []int64{2, 3, -6}
	valid := func() groupArgs {
		return groupArgs{
			kind: kindAllreduce, n: 2, ins: unsafe.Pointer(&ins[0]), outs: unsafe.Pointer(&outs[0]),
			dtypes: unsafe.Pointer(&dtypes[0]), shapes: unsafe.Pointer(&shapes[0]),
			ndims: unsafe.Pointer(&ndims[0]), op: int(kolo.Sum), prescale: 1, postscale: 1,
			device: -1, stream: hostMemory,
		}
	}
	for _, tc := range []struct {
		name  string
		spoil func(*groupArgs)
		want  string
	}{
		{"kind that cannot be grouped", func(a *groupArgs) { a.kind = kindBroadcast }, "argument kind = 3: cannot be grouped"},
		{"unknown kind", func(a *groupArgs) { a.kind = 77 }, "argument kind = 77: not an op kind"},
		{"unknown op", func(a *groupArgs) { a.op = 9 }, "argument reduceOp = 9"},
		{"negative process set", func(a *groupArgs) { a.processSet = -4 }, "argument processSet = -4"},
		{"null name with a length", func(a *groupArgs) { a.nameLen = 3 }, "argument name = NULL"},
		{"null ins", func(a *groupArgs) { a.ins = nil }, "argument ins = NULL"},
		{"null outs for allreduce", func(a *groupArgs) { a.outs = nil }, "argument outs = NULL"},
		{"null dtypes", func(a *groupArgs) { a.dtypes = nil }, "argument dtypes = NULL"},
		{"null ndims", func(a *groupArgs) { a.ndims = nil }, "argument ndims = NULL"},
		{"null shapes", func(a *groupArgs) { a.shapes = nil }, "argument shapes = NULL"},
		{"negative ndim", func(a *groupArgs) { a.ndims = unsafe.Pointer(&badNdims[0]) }, "argument ndims[1] = -1"},
		{"unknown dtype", func(a *groupArgs) { a.dtypes = unsafe.Pointer(&badDtypes[0]) }, "argument dtypes[1] = 99"},
		{"null input tensor", func(a *groupArgs) { a.ins = unsafe.Pointer(&withNil[0]) }, "argument ins[1] = NULL"},
		{"null output tensor", func(a *groupArgs) { a.outs = unsafe.Pointer(&withNil[0]) }, "argument outs[1] = NULL"},
		// Member 1's dimension, named as the C argument numbers it: its shape starts at shapes[2].
		{"negative dimension", func(a *groupArgs) { a.shapes = unsafe.Pointer(&badShapes[0]) }, "tensor 1: argument shapes[2] = -6"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lockThread(t) // a subtest runs on a goroutine of its own
			a := valid()
			tc.spoil(&a)
			ops := enqueueGroup(a)
			if len(ops) != a.n {
				t.Fatalf("%d ops, want %d", len(ops), a.n)
			}
			for i, o := range ops {
				var ae *argError
				if o.err == nil || !errors.As(o.err, &ae) || !strings.Contains(o.err.Error(), tc.want) {
					t.Errorf("member %d: error %v, want an argument error containing %q", i, o.failure(), tc.want)
				}
			}
		})
	}
	for _, o := range enqueueGroup(valid()) {
		if o.err != nil {
			t.Errorf("valid arguments refused: %v", o.err)
		}
	}
	// On the device path (a stream given): the stream is -1 or a handle, and the addresses are
	// never read (an empty CUDA tensor's is 0). What the device ordinal and the shapes mean is
	// kolo's to check, as for kolo_enqueue_device (TestDeviceArgumentsAreKolos).
	onDevice := func() groupArgs {
		a := valid()
		a.device, a.stream = 0, 0
		return a
	}
	for _, tc := range []struct {
		name  string
		spoil func(*groupArgs)
		want  string
	}{
		{"stream below -1", func(a *groupArgs) { a.stream = -2 }, "argument stream = -2"},
		{"kind that cannot be grouped", func(a *groupArgs) { a.kind = kindAlltoall }, "argument kind = 4: cannot be grouped"},
		{"unknown op", func(a *groupArgs) { a.op = 9 }, "argument reduceOp = 9"},
		{"null ins", func(a *groupArgs) { a.ins = nil }, "argument ins = NULL"},
		{"null outs for allreduce", func(a *groupArgs) { a.outs = nil }, "argument outs = NULL"},
		{"unknown dtype", func(a *groupArgs) { a.dtypes = unsafe.Pointer(&badDtypes[0]) }, "argument dtypes[1] = 99"},
		{"negative ndim", func(a *groupArgs) { a.ndims = unsafe.Pointer(&badNdims[0]) }, "argument ndims[1] = -1"},
	} {
		t.Run("device "+tc.name, func(t *testing.T) {
			a := onDevice()
			tc.spoil(&a)
			for i, o := range enqueueGroup(a) {
				var ae *argError
				if o.err == nil || !errors.As(o.err, &ae) || !strings.Contains(o.err.Error(), tc.want) {
					t.Errorf("member %d: error %v, want an argument error containing %q", i, o.failure(), tc.want)
				}
			}
		})
	}
	for _, tc := range []struct {
		name  string
		spoil func(*groupArgs)
	}{
		{"null addresses", func(a *groupArgs) {
			a.ins = unsafe.Pointer(&withNil[0]) // device addresses: 0 is an empty tensor's
			a.outs = unsafe.Pointer(&withNil[0])
		}},
		{"no device", func(a *groupArgs) { a.device = -1 }},
		{"negative dimension", func(a *groupArgs) { a.shapes = unsafe.Pointer(&badShapes[0]) }},
	} {
		a := onDevice()
		tc.spoil(&a)
		for i, o := range enqueueGroup(a) {
			if o.err != nil {
				t.Errorf("device group, %s: member %d refused here, not by kolo: %v", tc.name, i, o.err)
			}
		}
	}
}

// waitFor calls wait (a kolo_wait of 10 ms) until it reports the op done, as the Python side waits.
func waitFor(t *testing.T, wait func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !wait(); {
		if time.Now().After(deadline) {
			t.Fatal("op still pending after 30 s")
		}
	}
}

// The functions that read a completed op, given bad buffers or a handle with no result (init and
// shutdown run as handles too), in a job of one rank.
func TestResultFunctionsRefuseBadArguments(t *testing.T) {
	lockThread(t)
	hInit := kolo_init_async(nil, 0)
	waitFor(t, func() bool { return kolo_wait(hInit, 10000, 0) != statusPending })
	if st := kolo_poll(hInit); st != statusOK {
		t.Fatalf("init: status %d, error %v", st, lookup(int64(hInit)).failure())
	}
	defer func() {
		h := kolo_shutdown_async()
		waitFor(t, func() bool { return kolo_wait(h, 10000, 0) != statusPending })
		if err := lookup(int64(h)).failure(); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		kolo_release(h)
	}()
	defer kolo_release(hInit)

	p, shape := tensor6()
	h := issued(enqueue(enqueueArgs{
		kind: kindAllgather, in: p, dtype: 7, shape: unsafe.Pointer(&shape[0]), ndim: 2, op: int(kolo.Sum),
		prescale: 1, postscale: 1,
	}))
	waitFor(t, func() bool { return kolo_wait(h, 10000, 0) != statusPending })
	defer kolo_release(h)
	if n := kolo_result(h, nil, 0); n != 24 {
		t.Fatalf("allgather result of %d bytes, want 24 (error %q)", n, lastError())
	}
	out := make([]byte, 24)
	for _, tc := range []struct {
		name string
		call func() int64
		want string
	}{
		{"kolo_result null shape", func() int64 { return int64(kolo_result(h, nil, 2)) }, "argument shape = NULL"},
		{"kolo_result negative ndim", func() int64 { return int64(kolo_result(h, nil, -1)) }, "argument ndim = -1"},
		{"kolo_result_copy null dst", func() int64 { return int64(kolo_result_copy(h, nil, 24)) }, "argument dst = NULL"},
		{"kolo_result_copy wrong size", func() int64 {
			return int64(kolo_result_copy(h, unsafe.Pointer(&out[0]), 23))
		}, "argument nbytes = 23: the result has 24 bytes"},
		{"kolo_result_copy negative size", func() int64 {
			return int64(kolo_result_copy(h, unsafe.Pointer(&out[0]), -1))
		}, "argument nbytes = -1"},
		{"kolo_recv_splits null dst", func() int64 { return int64(kolo_recv_splits(h, nil, 2)) }, "argument dst = NULL"},
		{"kolo_recv_splits negative count", func() int64 { return int64(kolo_recv_splits(h, nil, -2)) }, "argument n = -2"},
		{"kolo_error null buffer", func() int64 { return int64(kolo_error(h, nil, 16)) }, "argument buf = NULL"},
		{"kolo_result of init", func() int64 { return int64(kolo_result(hInit, nil, 0)) }, "has no result"},
		{"kolo_result_copy of init", func() int64 {
			return int64(kolo_result_copy(hInit, unsafe.Pointer(&out[0]), 24))
		}, "has no result"},
		{"kolo_recv_splits of init", func() int64 { return int64(kolo_recv_splits(hInit, nil, 0)) }, "has no result"},
		{"kolo_join_last of init", func() int64 { return int64(kolo_join_last(hInit)) }, "has no result"},
		{"kolo_process_set_id of init", func() int64 { return int64(kolo_process_set_id(hInit)) }, "has no result"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lockThread(t) // a subtest runs on a goroutine of its own
			if got := tc.call(); got != -1 {
				t.Fatalf("returned %d, want -1", got)
			}
			if msg := lastError(); !strings.Contains(msg, tc.want) {
				t.Errorf("error %q, want it to contain %q", msg, tc.want)
			}
		})
	}
	if n := kolo_result_copy(h, unsafe.Pointer(&out[0]), 24); n != 24 {
		t.Errorf("the valid copy returned %d (error %q)", n, lastError())
	}
}

// Two threads failing at once each read their own error, as with errno.
func TestLastErrorIsPerThread(t *testing.T) {
	var wg sync.WaitGroup
	errs := make(chan string, 2)
	for i := range 2 {
		wg.Go(func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			for j := range 2000 {
				want := fmt.Sprintf("thread %d, call %d", i, j)
				setLastErr(errors.New(want))
				runtime.Gosched() // let the other thread fail in between
				if got := lastError(); got != want {
					errs <- fmt.Sprintf("read %q after failing with %q", got, want)
					return
				}
			}
			setLastErr(nil)
			if got := lastError(); got != "" {
				errs <- fmt.Sprintf("read %q after a success", got)
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}
