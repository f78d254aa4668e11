// Package nccl is the real device backend: the CUDA runtime and NCCL, both loaded with dlopen when
// a process first asks for them, so that kolo builds with no CUDA headers, libraries or compiler,
// and one build serves every CUDA and torch version. The few declarations it needs are written
// here (ncclConfig_t's layout, result codes, function signatures), checked against nccl.h's
// values in tests.
//
// Communicators are non-blocking (ncclCommInitRankConfig with blocking = 0): every call that
// reports ncclInProgress is polled with ncclCommGetAsyncError under a deadline, and a deadline or
// an abort from kolo's own failure detection ends the communicator with ncclCommAbort, so that
// no NCCL call can hang the engine.
//
// Without cgo (CGO_ENABLED=0, as the wheel's kolo command is built) Open reports that NCCL is
// unavailable and everything else still compiles. It must not decide policy (gpu.Decide does), and
// must not be linked against libnccl or libcudart.
package nccl

import (
	"errors"
	"fmt"
	"time"

	"github.com/kolo-dl/kolo/internal/gpu"
)

// Options says where to look besides the dynamic loader's search path.
type Options struct {
	// NCCLPaths are tried first (the binding passes torch's nvidia/nccl/lib/libnccl.so.2).
	NCCLPaths []string
	// CUDAPaths are CUDA runtime libraries tried first.
	CUDAPaths []string
	// CallTimeout bounds how long one call may stay ncclInProgress (connection set-up on first
	// use included) before the communicator is aborted; 0 means DefaultCallTimeout.
	CallTimeout time.Duration
}

// DefaultCallTimeout is generous: NCCL connects peers lazily inside the first collectives.
const DefaultCallTimeout = 5 * time.Minute

// Backend is a loaded NCCL with its CUDA runtime.
type Backend interface {
	gpu.Library
	Version() gpu.Version
	// Device is CUDA device ordinal as seen by this process (after CUDA_VISIBLE_DEVICES).
	Device(ordinal int) (gpu.Device, error)
	// PCIBusID is the device's PCI bus id, what gpu.Peer.GPU carries across ranks.
	PCIBusID(ordinal int) (string, error)
}

// Reasons the device path cannot serve; each matches gpu.ErrUnavailable too.
var (
	ErrNotFound = fmt.Errorf("%w: library not found", gpu.ErrUnavailable)
	ErrTooOld   = fmt.Errorf("%w: NCCL too old", gpu.ErrUnavailable)
	ErrNoCgo    = fmt.Errorf("%w: built without cgo: NCCL unavailable", gpu.ErrUnavailable)
)

// NCCL's ncclResult_t values (nccl.h).
const (
	resSuccess            = 0
	resUnhandledCudaError = 1
	resSystemError        = 2
	resInternalError      = 3
	resInvalidArgument    = 4
	resInvalidUsage       = 5
	resRemoteError        = 6
	resInProgress         = 7
	resTimeout            = 8
)

var resultNames = map[int]string{
	resSuccess: "ncclSuccess", resUnhandledCudaError: "ncclUnhandledCudaError", resSystemError: "ncclSystemError",
	resInternalError: "ncclInternalError", resInvalidArgument: "ncclInvalidArgument", resInvalidUsage: "ncclInvalidUsage",
	resRemoteError: "ncclRemoteError", resInProgress: "ncclInProgress", resTimeout: "ncclTimeout",
}

// ResultError is a failed NCCL call.
type ResultError struct {
	Call   string
	Code   int
	Detail string // ncclGetLastError's text, when the library has it
}

func (e *ResultError) Error() string {
	name, ok := resultNames[e.Code]
	if !ok {
		name = fmt.Sprintf("ncclResult %d", e.Code)
	}
	if e.Detail != "" {
		return fmt.Sprintf("%s: %s: %s", e.Call, name, e.Detail)
	}
	return fmt.Sprintf("%s: %s", e.Call, name)
}

// CUDAError is a failed CUDA runtime call.
type CUDAError struct {
	Call string
	Code int
	Text string // cudaGetErrorString's
}

func (e *CUDAError) Error() string {
	return fmt.Sprintf("%s: cudaError %d: %s", e.Call, e.Code, e.Text)
}

// cudaErrorNotReady is what cudaEventQuery/cudaStreamQuery return for unfinished work.
const cudaErrorNotReady = 600

// The layout kolo writes for ncclConfig_t: the fields of ncclConfig_v21700 (NCCL 2.17/2.18), the
// last ones kolo sets. NCCL copies min(size, its own sizeof) bytes and, for fields its version
// field says the caller did not know, uses its defaults (init.cc, parseCommConfig), so this
// prefix is valid for every NCCL from 2.14 to 2.28 and later.
const (
	configSize          = 48
	configOffMagic      = 8
	configOffVersion    = 12
	configOffBlocking   = 16
	configOffCGACluster = 20
	configOffMinCTAs    = 24
	configOffMaxCTAs    = 28
	configOffNetName    = 32
	configOffSplitShare = 40

	configMagic    = 0xcafebeef // NCCL_API_MAGIC
	configVersion  = 21700      // NCCL_VERSION(2,17,0): the layout above
	configUndefInt = -2147483648
)

// errNoSymbol is wrapped when a loaded library lacks a function kolo needs.
var errNoSymbol = errors.New("missing symbol")

func callTimeout(o Options) time.Duration {
	if o.CallTimeout > 0 {
		return o.CallTimeout
	}
	return DefaultCallTimeout
}

// checkVersion is Open's version rule.
func checkVersion(path string, code int) (gpu.Version, error) {
	v := gpu.NCCLVersion(code)
	if v.Less(gpu.MinNCCL) {
		return v, fmt.Errorf("%w: %s is NCCL %s, older than %d.%d (needs non-blocking communicators: ncclCommInitRankConfig, ncclInProgress)",
			ErrTooOld, path, v, gpu.MinNCCL.Major, gpu.MinNCCL.Minor)
	}
	return v, nil
}

// ncclNames and cudaNames are tried after the caller's paths. A soname already loaded in the
// process (torch's copy) is what dlopen returns for it.
var (
	ncclNames = []string{"libnccl.so.2", "libnccl.so"}
	cudaNames = []string{"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"}
)
