package main

/*
#include <stdint.h>
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unsafe"

	"github.com/kolo-dl/kolo"
)

// The GPU data path's C ABI. The binding calls, per rank:
//
//  1. kolo_device_setup(ordinal, nccl path) once, before its first CUDA-tensor op, and waits on
//     the handle (kolo_wait); then kolo_device_decision says whether the device path is used (1)
//     or GPU tensors are staged as before (0; kolo_device_why says why). A failed handle (KOLO_NCCL=1 and the
//     path cannot serve) is kolo_error's, to raise.
//  2. kolo_enqueue_device(rec, size, stream) per op: a kolo_op block as kolo_enqueue's, whose
//     in and out are device addresses (data_ptr()) and device the ordinal; stream is the
//     producer's cudaStream_t (torch.cuda.current_stream().cuda_stream). An op the device path
//     cannot run (Adasum, prescale/postscale, a type NCCL lacks) fails at once with
//     kolo_error_kind = errorUnavailable: the binding stages that op as before. A grouped call
//     goes in as one: kolo_enqueue_group with the stream (capi/ops.go), refused whole or not at all.
//  3. kolo_wait on the handle: it completes once the work is enqueued on kolo's stream; then
//     kolo_device_wait_stream(h, consumer stream) before the consumer uses the result, and for an
//     allgather, alltoall or reducescatter kolo_device_result (address, bytes, shape), a copy on
//     the consumer stream into the caller's tensor, and kolo_device_release(h, that stream).
//     kolo_device_sync blocks the host until the work ran, reporting a failure of the job (a lost
//     rank) after the enqueue. Release the handle (kolo_release) after; releasing it before
//     kolo_device_release leaks the result's device memory.

// errorUnavailable is kolo_error_kind's answer for an op the device path cannot run: the binding
// stages it through host memory.
const errorUnavailable = 3

// kolo_device_setup sets up the device path on CUDA device ordinal (nccl: torch's libnccl.so.2,
// tried first; ncclLen 0 for none) and returns a handle to wait on (kolo_wait), which fails when
// the path is required (KOLO_NCCL=1) and cannot serve or setting up failed. Every rank must call
// it before its first device op.
//
//export kolo_device_setup
func kolo_device_setup(ordinal C.int, nccl *C.char, ncclLen C.int) C.int64_t {
	path, err := cString("nccl", "ncclLen", unsafe.Pointer(nccl), int(ncclLen))
	if err == nil {
		err = notNegative("ordinal", int(ordinal))
	}
	if err != nil {
		return issued(&op{err: fmt.Errorf("kolo_device_setup: %w", err)})
	}
	var paths []string
	if path != "" {
		paths = []string{path}
	}
	return issued(&op{call: startCall(func() error {
		_, err := kolo.DevicePath(context.Background(), int(ordinal), paths...)
		return err
	})})
}

// kolo_device_decision is 1 when the device path serves GPU tensors, 0 when they are staged
// (kolo_device_why says why), -1 before kolo_device_setup's handle completed.
//
//export kolo_device_decision
func kolo_device_decision() C.int {
	dec, ok := kolo.DeviceDecision()
	switch {
	case !ok:
		return setLastErr(errors.New("kolo_device_decision: the device path is not decided yet (kolo_device_setup)"))
	case dec.Use:
		return 1
	}
	return 0
}

// kolo_device_why writes why GPU tensors are staged into buf, as kolo_error writes, and returns
// its length (0 when the device path is used or not decided yet).
//
//export kolo_device_why
func kolo_device_why(buf *C.char, capacity C.int) C.int {
	why := ""
	if dec, ok := kolo.DeviceDecision(); ok && dec.Why != nil {
		why = dec.Why.Error()
	}
	n, err := putString(why, buf, capacity)
	if err != nil {
		return setLastErr(fmt.Errorf("kolo_device_why: %w", err))
	}
	return n
}

// kolo_enqueue_device submits an op on device memory (see the list above) and returns its handle,
// negative when it failed at once (release it either way). The block's waitUS is ignored. It
// takes kolo_enqueue's path (enqueue), its tensors' addresses never read here.
//
//export kolo_enqueue_device
func kolo_enqueue_device(rec unsafe.Pointer, size C.int, stream C.int64_t) C.int64_t {
	a, err := opArgs(rec, int(size))
	if err != nil {
		return issued(&op{err: fmt.Errorf("kolo_enqueue_device: %w", err)})
	}
	a.onDevice, a.stream = true, uintptr(stream)
	return issued(enqueue(a))
}

// kolo_device_wait_stream makes the work enqueued from now on on stream (a cudaStream_t) wait
// until device op h's work has run, without blocking the host; 0, or -1 (kolo_last_error).
//
//export kolo_device_wait_stream
func kolo_device_wait_stream(h C.int64_t, stream C.int64_t) C.int {
	kh, err := completed(h)
	if err == nil {
		err = kh.WaitOnStream(uintptr(stream))
	}
	if err != nil {
		return setLastErr(fmt.Errorf("kolo_device_wait_stream: %w", err))
	}
	return 0
}

// kolo_device_sync blocks up to timeoutUS microseconds until device op h's work has run: 1 when
// it has, 0 when the time ran out, -1 when it failed (kolo_last_error says why: the job stopped
// after the op was enqueued) or for a bad handle.
//
//export kolo_device_sync
func kolo_device_sync(h C.int64_t, timeoutUS C.int64_t) C.int {
	if err := notNegative("timeoutUS", int64(timeoutUS)); err != nil {
		return setLastErr(fmt.Errorf("kolo_device_sync: %w", err))
	}
	kh, err := completed(h)
	if err != nil {
		return setLastErr(fmt.Errorf("kolo_device_sync: %w", err))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(timeoutUS)*time.Microsecond)
	defer cancel()
	err = kh.Synchronize(ctx)
	switch {
	case err == nil:
		return 1
	case errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil:
		return 0
	}
	return setLastErr(fmt.Errorf("kolo_device_sync: %w", err))
}

// kolo_device_result writes the device address of a completed device allgather's, alltoall's or
// reducescatter's result into ptr and its shape into shape (ndim entries, at least the input's
// rank), and returns its size in bytes; -1 otherwise (kolo_last_error).
//
//export kolo_device_result
func kolo_device_result(h C.int64_t, ptr *C.int64_t, shape *C.int64_t, ndim C.int) C.int64_t {
	kh, err := completed(h)
	if err != nil {
		return C.int64_t(setLastErr(fmt.Errorf("kolo_device_result: %w", err)))
	}
	p, n, dims := kh.DeviceOutput()
	if p == 0 && n == 0 && dims == nil {
		return C.int64_t(setLastErr(fmt.Errorf("kolo_device_result: handle %d has no device result", int64(h))))
	}
	dst, err := cArray[int64]("shape", "ndim", unsafe.Pointer(shape), int(ndim))
	if err == nil && len(dst) < len(dims) {
		err = &argError{"ndim", whole, int(ndim), fmt.Sprintf("the result has %d dimensions", len(dims))}
	}
	if err == nil && ptr == nil {
		err = &argError{"ptr", whole, "NULL", "where the result's address goes"}
	}
	if err != nil {
		return C.int64_t(setLastErr(fmt.Errorf("kolo_device_result: %w", err)))
	}
	copy(dst, dims)
	*ptr = C.int64_t(p)
	return C.int64_t(n)
}

// kolo_device_release frees device op h's result once the work enqueued so far on stream (the
// caller's copy of it) has run; 0, or -1 (kolo_last_error).
//
//export kolo_device_release
func kolo_device_release(h C.int64_t, stream C.int64_t) C.int {
	kh, err := completed(h)
	if err == nil {
		err = kh.ReleaseDeviceOutput(uintptr(stream))
	}
	if err != nil {
		return setLastErr(fmt.Errorf("kolo_device_release: %w", err))
	}
	return 0
}
