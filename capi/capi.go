// Command capi is kolo's C ABI: built with -buildmode=c-shared into libkolo.so, it is what the
// Python package (python/kolo/_lib.py) loads with ctypes. Every function is a thin //export over the
// root package kolo: tensors arrive as raw pointers (torch's data_ptr()) with a dtype and shape, ops
// come back as integer handles that the caller polls, waits on in short slices (so that Python can
// take KeyboardInterrupt between calls) and releases.
//
// Memory rules: pointers from the caller are C memory to Go, viewed with unsafe.Slice and valid
// until the op's handle completes (the caller keeps the tensors alive); nothing here hands a Go
// pointer to C to keep. Results whose size is known only after negotiation (allgather, alltoall,
// reducescatter) stay in Go memory until the caller copies them out. Strings go into buffers the
// caller provides.
//
// It must stay thin: argument conversion and the handle table only; logic belongs in package kolo
// or the engine. It links no framework: one build serves every torch version.
//
//	go build -buildmode=c-shared -o python/kolo/lib/libkolo.so ./capi
package main

/*
#include <stdint.h>
*/
import "C"

import (
	"errors"
	"sync"
	"unsafe"

	"github.com/kolo-dl/kolo"
)

func main() {} // required by -buildmode=c-shared; never runs

// lastErr is the error of the last failed call that has no handle to carry it (init, shutdown).
var (
	lastErrMu sync.Mutex
	lastErr   string
)

func setLastErr(err error) C.int {
	lastErrMu.Lock()
	defer lastErrMu.Unlock()
	if err == nil {
		lastErr = ""
		return 0
	}
	lastErr = err.Error()
	return -1
}

// putString copies s into buf (cap bytes, NUL-terminated when it fits) and returns len(s): the
// caller retries with a larger buffer when the result is >= cap.
func putString(s string, buf *C.char, capacity C.int) C.int {
	if buf != nil && capacity > 0 {
		dst := unsafe.Slice((*byte)(unsafe.Pointer(buf)), int(capacity))
		n := copy(dst[:len(dst)-1], s)
		dst[n] = 0
	}
	return C.int(len(s))
}

// kolo_version writes the library's version (kolo.Version) into buf.
//
//export kolo_version
func kolo_version(buf *C.char, capacity C.int) C.int {
	return putString(kolo.Version, buf, capacity)
}

// kolo_last_error writes the error of the last failed kolo_init or kolo_shutdown into buf.
//
//export kolo_last_error
func kolo_last_error(buf *C.char, capacity C.int) C.int {
	lastErrMu.Lock()
	defer lastErrMu.Unlock()
	return putString(lastErr, buf, capacity)
}

// kolo_init joins the job the launcher started this process in (kolo.Init). 0 on success, -1 with
// the reason in kolo_last_error.
//
//export kolo_init
func kolo_init() C.int {
	return setLastErr(kolo.Init())
}

// kolo_shutdown waits for every rank to reach shutdown, then leaves the job (kolo.Shutdown).
// Handles not yet released stay valid for kolo_error and kolo_release.
//
//export kolo_shutdown
func kolo_shutdown() C.int {
	return setLastErr(kolo.Shutdown())
}

// kolo_abort tells every rank that this one failed, with reason (len bytes, not NUL-terminated),
// so that their ops fail with it rather than with "rank N lost" (kolo.Abort).
//
//export kolo_abort
func kolo_abort(reason *C.char, length C.int) {
	msg := C.GoStringN(reason, length)
	if msg == "" {
		msg = "aborted"
	}
	kolo.Abort(errors.New(msg))
}

//export kolo_is_initialized
func kolo_is_initialized() C.int {
	if kolo.IsInitialized() {
		return 1
	}
	return 0
}

// The topology queries return -1 before init.

//export kolo_rank
func kolo_rank() C.int { return C.int(kolo.Rank()) }

//export kolo_size
func kolo_size() C.int { return C.int(kolo.Size()) }

//export kolo_local_rank
func kolo_local_rank() C.int { return C.int(kolo.LocalRank()) }

//export kolo_local_size
func kolo_local_size() C.int { return C.int(kolo.LocalSize()) }

//export kolo_cross_rank
func kolo_cross_rank() C.int { return C.int(kolo.CrossRank()) }

//export kolo_cross_size
func kolo_cross_size() C.int { return C.int(kolo.CrossSize()) }

// kolo_is_homogeneous is 1 when every host runs the same number of ranks, 0 if not, -1 before init.
//
//export kolo_is_homogeneous
func kolo_is_homogeneous() C.int {
	if !kolo.IsInitialized() {
		return -1
	}
	if kolo.IsHomogeneous() {
		return 1
	}
	return 0
}
