// Command capi is kolo's C ABI: built with -buildmode=c-shared into libkolo.so, it is what the
// Python package (python/kolo/_lib.py) loads with ctypes. Every function is a thin //export over the
// root package kolo: tensors arrive as raw pointers (torch's data_ptr()) with a dtype and shape, ops
// come back as integer handles that the caller polls, waits on in short slices (so that Python can
// take KeyboardInterrupt between calls) and releases. Joining and leaving the job (init, shutdown)
// wait on other ranks too, so they also return handles.
//
// Arguments are checked before use (args.go): a bad one is the function's ordinary error, never a
// Go panic, which would kill the host process.
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
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"syscall"
	"unsafe"

	"github.com/kolo-dl/kolo"
)

func main() {} // required by -buildmode=c-shared; never runs

// lastErrs holds, per OS thread, the error of the last failed call that has no handle to carry
// it: a refused argument, or a failed kolo_start_timeline. Like errno it is per thread, so that two
// Python threads failing at once each read their own: an exported function runs on its caller's
// thread, which is the thread that then calls kolo_last_error.
var (
	lastErrMu sync.Mutex
	lastErrs  = map[int]string{}
)

// maxLastErrs bounds lastErrs: threads that failed once and ended leave their entry behind.
const maxLastErrs = 4096

func setLastErr(err error) C.int {
	tid := syscall.Gettid()
	lastErrMu.Lock()
	defer lastErrMu.Unlock()
	if err == nil {
		delete(lastErrs, tid)
		return 0
	}
	if _, ok := lastErrs[tid]; !ok && len(lastErrs) >= maxLastErrs {
		clear(lastErrs)
	}
	lastErrs[tid] = err.Error()
	return -1
}

// threadLastErr is the calling thread's last error ("" if none).
func threadLastErr() string {
	lastErrMu.Lock()
	defer lastErrMu.Unlock()
	return lastErrs[syscall.Gettid()]
}

// putString copies s into buf (capacity bytes, NUL-terminated when it fits) and returns len(s):
// the caller retries with a larger buffer when the result is >= capacity. buf may be NULL with
// capacity 0, to ask for the length.
func putString(s string, buf *C.char, capacity C.int) (C.int, error) {
	dst, err := cArray[byte]("buf", "capacity", unsafe.Pointer(buf), int(capacity))
	if err != nil {
		return -1, err
	}
	if len(dst) > 0 {
		n := copy(dst[:len(dst)-1], s)
		dst[n] = 0
	}
	return C.int(len(s)), nil
}

// kolo_version writes the library's version (kolo.Version) into buf; -1 for a bad buffer.
//
//export kolo_version
func kolo_version(buf *C.char, capacity C.int) C.int {
	n, err := putString(kolo.Version, buf, capacity)
	if err != nil {
		return setLastErr(fmt.Errorf("kolo_version: %w", err))
	}
	return n
}

// kolo_last_error writes the error of this thread's last call that failed without a handle to
// carry it (every function that returns -1 on failure sets it) into buf; -1 for a bad buffer.
//
//export kolo_last_error
func kolo_last_error(buf *C.char, capacity C.int) C.int {
	n, err := putString(threadLastErr(), buf, capacity)
	if err != nil {
		return -1 // the last error is what the caller is reading: leave it
	}
	return n
}

// kolo_init_async starts joining the job the launcher started this process in (kolo.Init) and
// returns a handle, as kolo_enqueue does: joining waits for the other ranks, up to the setup
// timeout, so the caller waits on the handle in short slices (kolo_wait) and can be interrupted
// meanwhile. Init goes on regardless: a caller that stopped waiting waits on the handle again
// before it calls kolo_init_async or kolo_shutdown_async, which would race it.
//
// ranks (n int64s) limits the world to those ranks of the launcher's job (kolo.WithRanks: Horovod's
// init(comm=[...])); NULL with n 0 joins every rank.
//
//export kolo_init_async
func kolo_init_async(ranks *C.int64_t, n C.int) C.int64_t {
	rs, err := cInt64s("ranks", "n", unsafe.Pointer(ranks), int(n))
	if err != nil {
		return issued(&op{err: fmt.Errorf("kolo_init_async: %w", err)})
	}
	// Go runs only kolo in this process: its threads keep to this rank's share of the CPUs.
	opts := []kolo.Option{kolo.WithCPUShare()}
	if ranks != nil {
		list := make([]int, len(rs))
		for i, r := range rs {
			list[i] = int(r)
		}
		opts = append(opts, kolo.WithRanks(list))
	}
	return issued(&op{call: startCall(func() error { return kolo.Init(opts...) })})
}

// kolo_shutdown_async starts leaving the job (kolo.Shutdown: it waits for every rank to reach
// shutdown, up to a timeout) and returns a handle to wait on, as kolo_init_async does. Handles not
// yet released stay valid for kolo_error and kolo_release.
//
//export kolo_shutdown_async
func kolo_shutdown_async() C.int64_t {
	return issued(&op{call: startCall(kolo.Shutdown)})
}

// kolo_mark_step tells kolo that the program finished one training step (kolo.MarkStep): the
// autotuner times the job by these marks.
//
//export kolo_mark_step
func kolo_mark_step() { kolo.MarkStep() }

// kolo_rank_stats writes this rank's figures (kolo.RankStats) as JSON into buf, as kolo_error
// writes, and returns its length; -1 with kolo_last_error before init. Durations are seconds;
// "lateness" maps ranks to seconds on rank 0 only.
//
//export kolo_rank_stats
func kolo_rank_stats(buf *C.char, capacity C.int) C.int {
	st, err := kolo.RankStats()
	if err != nil {
		return setLastErr(fmt.Errorf("kolo_rank_stats: %w", err))
	}
	b, err := json.Marshal(statsJSON(st))
	if err != nil {
		return setLastErr(fmt.Errorf("kolo_rank_stats: %w", err))
	}
	n, err := putString(string(b), buf, capacity)
	if err != nil {
		return setLastErr(fmt.Errorf("kolo_rank_stats: %w", err))
	}
	return n
}

// rankStats is kolo.Stats as the binding reads it: seconds, not nanoseconds.
type rankStats struct {
	Rank          int                `json:"rank"`
	Up            float64            `json:"up"`
	Steps         uint64             `json:"steps"`
	StepMedian    float64            `json:"step_median"`
	StepP95       float64            `json:"step_p95"`
	InCollectives float64            `json:"in_collectives"`
	BytesReduced  uint64             `json:"bytes_reduced"`
	OpsDone       uint64             `json:"ops_done"`
	OpsFailed     uint64             `json:"ops_failed"`
	Lateness      map[string]float64 `json:"lateness"`
	Slowest       int                `json:"slowest"`
}

func statsJSON(st kolo.Stats) rankStats {
	r := rankStats{Rank: st.Rank, Up: st.Up.Seconds(), Steps: st.Steps, StepMedian: st.StepMedian.Seconds(),
		StepP95: st.StepP95.Seconds(), InCollectives: st.InCollectives.Seconds(), BytesReduced: st.BytesReduced,
		OpsDone: st.OpsDone, OpsFailed: st.OpsFailed, Slowest: st.Slowest}
	if st.Lateness != nil {
		r.Lateness = make(map[string]float64, len(st.Lateness))
		for rank, d := range st.Lateness {
			r.Lateness[strconv.Itoa(rank)] = d.Seconds()
		}
	}
	return r
}

// kolo_abort tells every rank that this one failed, with reason (length bytes, not
// NUL-terminated), so that their ops fail with it rather than with "rank N lost" (kolo.Abort).
// 0, or -1 with kolo_last_error for a bad argument.
//
//export kolo_abort
func kolo_abort(reason *C.char, length C.int) C.int {
	msg, err := cString("reason", "length", unsafe.Pointer(reason), int(length))
	if err != nil {
		return setLastErr(fmt.Errorf("kolo_abort: %w", err))
	}
	if msg == "" {
		msg = "aborted"
	}
	kolo.Abort(errors.New(msg))
	return 0
}

// kolo_report_failure tells kolo run that this process is leaving on an uncaught exception, whose
// text is reason (length bytes, not NUL-terminated): own 1 for the program's own exception (as
// kolo_abort, which it also does: the other ranks' ops fail with it), 0 for kolo's error (a failed
// op: the engine's record of it is sent, kolo.ReportFailure). It returns once the launcher has the
// record (bounded), so the caller may exit at once: 0, or -1 with kolo_last_error for a bad
// argument.
//
//export kolo_report_failure
func kolo_report_failure(reason *C.char, length C.int, own C.int) C.int {
	msg, err := cString("reason", "length", unsafe.Pointer(reason), int(length))
	if err != nil {
		return setLastErr(fmt.Errorf("kolo_report_failure: %w", err))
	}
	if msg == "" {
		msg = "failed"
	}
	if own != 0 {
		kolo.Abort(errors.New(msg))
	} else {
		kolo.ReportFailure(errors.New(msg))
	}
	return 0
}

// kolo_failed is 1 when the engine stopped on an error (kolo.Failed: every op fails; a new
// kolo_init_async joins a new world), else 0.
//
//export kolo_failed
func kolo_failed() C.int {
	if kolo.Failed() {
		return 1
	}
	return 0
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

// kolo_elastic_enabled is 1 when this process is a worker of an elastic job (kolo run with
// --min-np, --max-np or --host-discovery-script), else 0; it reads the environment, so it
// answers before init.
//
//export kolo_elastic_enabled
func kolo_elastic_enabled() C.int {
	if kolo.IsElastic() {
		return 1
	}
	return 0
}

// kolo_elastic_round is the elastic round this worker is in (1, 2, ...), 0 when this is not an
// elastic worker or it is not initialized.
//
//export kolo_elastic_round
func kolo_elastic_round() C.int64_t { return C.int64_t(kolo.ElasticRound()) }

// kolo_elastic_update is 1 when the launcher has published a round after this worker's
// (kolo.ElasticUpdate), with its number in *newest and *removal_only 1 when that round only
// removed workers; 0 when none; -1 (kolo_last_error) when not initialized in an elastic job or
// for a NULL pointer.
//
//export kolo_elastic_update
func kolo_elastic_update(newest *C.int64_t, removalOnly *C.int) C.int {
	if newest == nil || removalOnly == nil {
		return setLastErr(errors.New("kolo_elastic_update: newest and removal_only must not be NULL"))
	}
	if !kolo.IsInitialized() {
		return setLastErr(fmt.Errorf("kolo_elastic_update: %w", kolo.ErrNotInitialized))
	}
	if !kolo.IsElastic() {
		*newest, *removalOnly = 0, 0
		return 0
	}
	n, removal, ok := kolo.ElasticUpdate()
	*newest, *removalOnly = C.int64_t(n), 0
	if removal {
		*removalOnly = 1
	}
	if ok {
		return 1
	}
	return 0
}
