//go:build cgo && linux

package nccl

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

// The declarations kolo needs from nccl.h and cuda_runtime_api.h, written here so that no CUDA
// or NCCL header is needed to build. Handles are opaque pointers.
typedef int ncclResult_t;
typedef void* ncclComm_t;
typedef struct { char internal[128]; } ncclUniqueId;
typedef struct {
	size_t size;
	unsigned int magic;
	unsigned int version;
	int blocking;
	int cgaClusterSize;
	int minCTAs;
	int maxCTAs;
	const char* netName;
	int splitShare;
} koloNcclConfig; // ncclConfig_v21700
_Static_assert(sizeof(ncclUniqueId) == 128, "NCCL_UNIQUE_ID_BYTES");

typedef int cudaError_t;
typedef void* cudaStream_t;
typedef void* cudaEvent_t;

// Values of nccl.h's and cuda_runtime_api.h's names, checked against the headers in tests.
#define koloConfigMagic 0xcafebeef    // NCCL_CONFIG_INITIALIZER's magic
#define koloConfigVersion 21700       // NCCL_VERSION(2,17,0): the layout of koloNcclConfig
#define koloConfigUndef INT32_MIN     // NCCL_CONFIG_UNDEF_INT
#define koloStreamNonBlocking 1       // cudaStreamNonBlocking
#define koloEventDisableTiming 2      // cudaEventDisableTiming
#define koloMemcpyDeviceToDevice 3    // cudaMemcpyDeviceToDevice

static size_t kolo_config_offset(int field) {
	switch (field) {
	case 0: return offsetof(koloNcclConfig, magic);
	case 1: return offsetof(koloNcclConfig, version);
	case 2: return offsetof(koloNcclConfig, blocking);
	case 3: return offsetof(koloNcclConfig, cgaClusterSize);
	case 4: return offsetof(koloNcclConfig, minCTAs);
	case 5: return offsetof(koloNcclConfig, maxCTAs);
	case 6: return offsetof(koloNcclConfig, netName);
	case 7: return offsetof(koloNcclConfig, splitShare);
	}
	return (size_t)-1;
}

static struct {
	ncclResult_t (*getVersion)(int*);
	ncclResult_t (*getUniqueId)(ncclUniqueId*);
	ncclResult_t (*commInitRankConfig)(ncclComm_t*, int, ncclUniqueId, int, koloNcclConfig*);
	ncclResult_t (*commGetAsyncError)(ncclComm_t, ncclResult_t*);
	ncclResult_t (*commAbort)(ncclComm_t);
	ncclResult_t (*commDestroy)(ncclComm_t);
	ncclResult_t (*commFinalize)(ncclComm_t);
	ncclResult_t (*commCount)(ncclComm_t, int*);
	ncclResult_t (*commUserRank)(ncclComm_t, int*);
	ncclResult_t (*commSplit)(ncclComm_t, int, int, ncclComm_t*, koloNcclConfig*); // NULL before 2.18
	ncclResult_t (*allReduce)(const void*, void*, size_t, int, int, ncclComm_t, cudaStream_t);
	ncclResult_t (*broadcast)(const void*, void*, size_t, int, int, ncclComm_t, cudaStream_t);
	ncclResult_t (*allGather)(const void*, void*, size_t, int, ncclComm_t, cudaStream_t);
	ncclResult_t (*reduceScatter)(const void*, void*, size_t, int, int, ncclComm_t, cudaStream_t);
	ncclResult_t (*send)(const void*, size_t, int, int, ncclComm_t, cudaStream_t);
	ncclResult_t (*recv)(void*, size_t, int, int, ncclComm_t, cudaStream_t);
	ncclResult_t (*groupStart)(void);
	ncclResult_t (*groupEnd)(void);
	const char* (*getLastError)(ncclComm_t); // NULL before 2.13

	cudaError_t (*setDevice)(int);
	cudaError_t (*getDevice)(int*);
	cudaError_t (*malloc)(void**, size_t);
	cudaError_t (*free)(void*);
	cudaError_t (*streamCreateWithFlags)(cudaStream_t*, unsigned int);
	cudaError_t (*streamDestroy)(cudaStream_t);
	cudaError_t (*streamQuery)(cudaStream_t);
	cudaError_t (*streamWaitEvent)(cudaStream_t, cudaEvent_t, unsigned int);
	cudaError_t (*eventCreateWithFlags)(cudaEvent_t*, unsigned int);
	cudaError_t (*eventRecord)(cudaEvent_t, cudaStream_t);
	cudaError_t (*eventQuery)(cudaEvent_t);
	cudaError_t (*eventDestroy)(cudaEvent_t);
	cudaError_t (*memcpyAsync)(void*, const void*, size_t, int, cudaStream_t);
	cudaError_t (*deviceGetPCIBusId)(char*, int, int);
	const char* (*getErrorString)(cudaError_t);
} K;

static void* kolo_open(const char* path, int loaded) {
	return dlopen(path, RTLD_NOW | RTLD_LOCAL | (loaded ? RTLD_NOLOAD : 0));
}

static const char* kolo_dlerror(void) {
	const char* e = dlerror();
	return e ? e : "";
}

#define SYM(h, field, name) if (!(*(void**)(&K.field) = dlsym(h, name))) return name;
#define OPT(h, field, name) *(void**)(&K.field) = dlsym(h, name);

// kolo_bind_nccl fills K's NCCL functions; it returns the name of a missing one, or NULL.
static const char* kolo_bind_nccl(void* h) {
	SYM(h, getVersion, "ncclGetVersion")
	SYM(h, getUniqueId, "ncclGetUniqueId")
	SYM(h, commInitRankConfig, "ncclCommInitRankConfig")
	SYM(h, commGetAsyncError, "ncclCommGetAsyncError")
	SYM(h, commAbort, "ncclCommAbort")
	SYM(h, commDestroy, "ncclCommDestroy")
	SYM(h, commFinalize, "ncclCommFinalize")
	SYM(h, commCount, "ncclCommCount")
	SYM(h, commUserRank, "ncclCommUserRank")
	SYM(h, allReduce, "ncclAllReduce")
	SYM(h, broadcast, "ncclBroadcast")
	SYM(h, allGather, "ncclAllGather")
	SYM(h, reduceScatter, "ncclReduceScatter")
	SYM(h, send, "ncclSend")
	SYM(h, recv, "ncclRecv")
	SYM(h, groupStart, "ncclGroupStart")
	SYM(h, groupEnd, "ncclGroupEnd")
	OPT(h, commSplit, "ncclCommSplit")
	OPT(h, getLastError, "ncclGetLastError")
	return NULL;
}

static const char* kolo_bind_cuda(void* h) {
	SYM(h, setDevice, "cudaSetDevice")
	SYM(h, getDevice, "cudaGetDevice")
	SYM(h, malloc, "cudaMalloc")
	SYM(h, free, "cudaFree")
	SYM(h, streamCreateWithFlags, "cudaStreamCreateWithFlags")
	SYM(h, streamDestroy, "cudaStreamDestroy")
	SYM(h, streamQuery, "cudaStreamQuery")
	SYM(h, streamWaitEvent, "cudaStreamWaitEvent")
	SYM(h, eventCreateWithFlags, "cudaEventCreateWithFlags")
	SYM(h, eventRecord, "cudaEventRecord")
	SYM(h, eventQuery, "cudaEventQuery")
	SYM(h, eventDestroy, "cudaEventDestroy")
	SYM(h, memcpyAsync, "cudaMemcpyAsync")
	SYM(h, deviceGetPCIBusId, "cudaDeviceGetPCIBusId")
	SYM(h, getErrorString, "cudaGetErrorString")
	return NULL;
}

static int kolo_has_split(void) { return K.commSplit != NULL; }
static int kolo_nccl_version(int* v) { return K.getVersion(v); }
static const char* kolo_nccl_last_error(uintptr_t c) { return K.getLastError ? K.getLastError((ncclComm_t)c) : ""; }
static const char* kolo_cuda_error_string(int e) { return K.getErrorString(e); }

// ON(dev, call) is the body of a function that makes call with dev current on the calling thread
// and gives the thread its device back after: the current device is per thread, a goroutine may
// run on any thread, and the thread may be the Python thread, whose current device is torch's.
#define ON(dev, call) { \
	int prev_ = 0; \
	cudaError_t e_ = K.getDevice(&prev_); \
	if (e_) return e_; \
	if (prev_ != (dev) && (e_ = K.setDevice(dev))) return e_; \
	int r_ = (call); \
	if (prev_ != (dev)) K.setDevice(prev_); \
	return r_; \
}

static int kolo_malloc(int dev, uintptr_t* p, size_t n) ON(dev, K.malloc((void**)p, n))
static int kolo_free(int dev, uintptr_t p) ON(dev, K.free((void*)p))
static int kolo_stream_create(int dev, uintptr_t* s) ON(dev, K.streamCreateWithFlags((cudaStream_t*)s, koloStreamNonBlocking))
static int kolo_stream_destroy(int dev, uintptr_t s) ON(dev, K.streamDestroy((cudaStream_t)s))
static int kolo_stream_query(int dev, uintptr_t s) ON(dev, K.streamQuery((cudaStream_t)s))
static int kolo_stream_wait_event(int dev, uintptr_t s, uintptr_t ev) ON(dev, K.streamWaitEvent((cudaStream_t)s, (cudaEvent_t)ev, 0))
static int kolo_event_create(int dev, uintptr_t* ev) ON(dev, K.eventCreateWithFlags((cudaEvent_t*)ev, koloEventDisableTiming))
static int kolo_event_record(int dev, uintptr_t ev, uintptr_t s) ON(dev, K.eventRecord((cudaEvent_t)ev, (cudaStream_t)s))
static int kolo_event_query(int dev, uintptr_t ev) ON(dev, K.eventQuery((cudaEvent_t)ev))
static int kolo_event_destroy(int dev, uintptr_t ev) ON(dev, K.eventDestroy((cudaEvent_t)ev))
static int kolo_memcpy_d2d(int dev, uintptr_t dst, uintptr_t src, size_t n, uintptr_t s) ON(dev, K.memcpyAsync((void*)dst, (const void*)src, n, koloMemcpyDeviceToDevice, (cudaStream_t)s))
static int kolo_pci_bus_id(int dev, char* buf, int n) { return K.deviceGetPCIBusId(buf, n, dev); }

static int kolo_unique_id(char* out) { ncclUniqueId id; int r = K.getUniqueId(&id); memcpy(out, id.internal, 128); return r; }

// kolo_config is NCCL_CONFIG_INITIALIZER with blocking off: every communicator kolo makes is
// non-blocking, so that a lost peer can be aborted.
static void kolo_config(koloNcclConfig* cfg) {
	memset(cfg, 0, sizeof *cfg);
	cfg->size = sizeof *cfg;
	cfg->magic = koloConfigMagic;
	cfg->version = koloConfigVersion;
	cfg->blocking = 0;
	cfg->cgaClusterSize = cfg->minCTAs = cfg->maxCTAs = cfg->splitShare = koloConfigUndef;
	cfg->netName = NULL;
}

// A communicator slot is where NCCL writes a new communicator: C heap memory, since NCCL keeps the
// pointer after the call returned. 2.14 to 2.17's init thread reads and writes the communicator
// through it until set-up ends; ncclCommSplit leaves NCCL_COMM_NULL there and stores the new
// communicator from its own thread when the split completes. A C stack local would be written
// after its frame is gone, and Go memory may not be kept by C.
static ncclComm_t* kolo_slot_new(void) { ncclComm_t* p = malloc(sizeof *p); if (p) *p = NULL; return p; }
static uintptr_t kolo_slot_read(ncclComm_t* p) { return (uintptr_t)__atomic_load_n(p, __ATOMIC_ACQUIRE); }
static void kolo_slot_free(ncclComm_t* p) { free(p); }

static int kolo_comm_init_on(ncclComm_t* slot, int n, const char* idBytes, int rank) {
	ncclUniqueId id;
	memcpy(id.internal, idBytes, 128);
	koloNcclConfig cfg;
	kolo_config(&cfg);
	return K.commInitRankConfig(slot, n, id, rank, &cfg);
}

static int kolo_comm_init(int dev, ncclComm_t* slot, int n, const char* idBytes, int rank) ON(dev, kolo_comm_init_on(slot, n, idBytes, rank))

static int kolo_comm_split_on(uintptr_t c, int color, int key, ncclComm_t* slot) {
	koloNcclConfig cfg;
	kolo_config(&cfg);
	return K.commSplit((ncclComm_t)c, color, key, slot, &cfg);
}
static int kolo_comm_split(int dev, uintptr_t c, int color, int key, ncclComm_t* slot) ON(dev, kolo_comm_split_on(c, color, key, slot))

static int kolo_async_error(uintptr_t c, int* state) { ncclResult_t s = 0; int r = K.commGetAsyncError((ncclComm_t)c, &s); *state = s; return r; }
// Abort, destroy and finalize run with the communicator's device current: NCCL's clean-up (its
// group end) otherwise works on, and may create a context on, whatever device the thread has.
static int kolo_abort(int dev, uintptr_t c) ON(dev, K.commAbort((ncclComm_t)c))
static int kolo_destroy(int dev, uintptr_t c) ON(dev, K.commDestroy((ncclComm_t)c))
static int kolo_finalize(int dev, uintptr_t c) ON(dev, K.commFinalize((ncclComm_t)c))
static int kolo_rank_size(uintptr_t c, int* rank, int* size) { int r = K.commUserRank((ncclComm_t)c, rank); return r ? r : K.commCount((ncclComm_t)c, size); }
static int kolo_all_reduce(int dev, uintptr_t s, uintptr_t r, size_t n, int t, int op, uintptr_t c, uintptr_t st) ON(dev, K.allReduce((void*)s, (void*)r, n, t, op, (ncclComm_t)c, (cudaStream_t)st))
static int kolo_broadcast(int dev, uintptr_t s, uintptr_t r, size_t n, int t, int root, uintptr_t c, uintptr_t st) ON(dev, K.broadcast((void*)s, (void*)r, n, t, root, (ncclComm_t)c, (cudaStream_t)st))
static int kolo_all_gather(int dev, uintptr_t s, uintptr_t r, size_t n, int t, uintptr_t c, uintptr_t st) ON(dev, K.allGather((void*)s, (void*)r, n, t, (ncclComm_t)c, (cudaStream_t)st))
static int kolo_reduce_scatter(int dev, uintptr_t s, uintptr_t r, size_t n, int t, int op, uintptr_t c, uintptr_t st) ON(dev, K.reduceScatter((void*)s, (void*)r, n, t, op, (ncclComm_t)c, (cudaStream_t)st))
static int kolo_send(int dev, uintptr_t b, size_t n, int t, int peer, uintptr_t c, uintptr_t st) ON(dev, K.send((void*)b, n, t, peer, (ncclComm_t)c, (cudaStream_t)st))
static int kolo_recv(int dev, uintptr_t b, size_t n, int t, int peer, uintptr_t c, uintptr_t st) ON(dev, K.recv((void*)b, n, t, peer, (ncclComm_t)c, (cudaStream_t)st))
static int kolo_group_start(void) { return K.groupStart(); }
static int kolo_group_end(void) { return K.groupEnd(); }
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/kolo-dl/kolo/internal/gpu"
)

// The C side binds one NCCL and one CUDA runtime per process; Open binds them once.
var (
	openOnce    sync.Once
	openBackend *backend
	openErr     error
)

// Open loads NCCL and the CUDA runtime and checks NCCL's version. Its error says why the device
// path cannot serve (it matches gpu.ErrUnavailable): the caller logs it and stages. The first
// call's options decide for the life of the process.
func Open(o Options) (Backend, error) {
	openOnce.Do(func() { openBackend, openErr = open(o) })
	if openErr != nil {
		return nil, openErr
	}
	return openBackend, nil
}

func open(o Options) (*backend, error) {
	ncclPath, nh, err := dlopenFirst(append(append([]string(nil), o.NCCLPaths...), ncclNames...))
	if err != nil {
		return nil, fmt.Errorf("%w: libnccl.so.2 not found (%v)", ErrNotFound, err)
	}
	if missing := C.kolo_bind_nccl(nh); missing != nil {
		return nil, fmt.Errorf("%w: %s: %w %s", ErrTooOld, ncclPath, errNoSymbol, C.GoString(missing))
	}
	var code C.int
	if r := C.kolo_nccl_version(&code); r != resSuccess {
		return nil, fmt.Errorf("%w: %s: %w", gpu.ErrUnavailable, ncclPath, &ResultError{Call: "ncclGetVersion", Code: int(r)})
	}
	v, err := checkVersion(ncclPath, int(code))
	if err != nil {
		return nil, err
	}
	cudaPath, ch, err := dlopenFirst(append(append([]string(nil), o.CUDAPaths...), cudaNames...))
	if err != nil {
		return nil, fmt.Errorf("%w: CUDA runtime (libcudart) not found (%v)", ErrNotFound, err)
	}
	if missing := C.kolo_bind_cuda(ch); missing != nil {
		return nil, fmt.Errorf("%w: %s: %w %s", gpu.ErrUnavailable, cudaPath, errNoSymbol, C.GoString(missing))
	}
	return &backend{version: v, split: C.kolo_has_split() != 0, timeout: callTimeout(o)}, nil
}

// dlopenFirst returns the first of paths already loaded in the process, else the first that loads,
// else every failure. A library already there (torch's NCCL and CUDA runtime) is preferred to
// any other, the loader's first name included: two CUDA runtimes in one process share no
// devices, streams or memory.
func dlopenFirst(paths []string) (string, unsafe.Pointer, error) {
	for _, p := range paths {
		if h := dlopen(p, true); h != nil {
			return p, h, nil
		}
	}
	var why []string
	for _, p := range paths {
		if h := dlopen(p, false); h != nil {
			return p, h, nil
		}
		why = append(why, C.GoString(C.kolo_dlerror()))
	}
	return "", nil, fmt.Errorf("tried %s", strings.Join(why, "; "))
}

// dlopen opens path, or with loaded finds it only if it is in the process already.
func dlopen(path string, loaded bool) unsafe.Pointer {
	cp := C.CString(path)
	defer C.free(unsafe.Pointer(cp))
	l := C.int(0)
	if loaded {
		l = 1
	}
	return C.kolo_open(cp, l)
}

func cudaErr(call string, code C.int) error {
	if code == 0 {
		return nil
	}
	return &CUDAError{Call: call, Code: int(code), Text: C.GoString(C.kolo_cuda_error_string(code))}
}

// configOffset is the C compiler's offset of ncclConfig_v21700's field i, for the layout test.
func configOffset(i int) uintptr { return uintptr(C.kolo_config_offset(C.int(i))) }

const cConfigSize = C.sizeof_koloNcclConfig

// backend is the loaded libraries. Its methods are safe for concurrent use.
type backend struct {
	version gpu.Version
	split   bool
	timeout time.Duration
}

func (b *backend) Version() gpu.Version { return b.version }

func (b *backend) Device(ordinal int) (gpu.Device, error) {
	if _, err := b.PCIBusID(ordinal); err != nil {
		return nil, err
	}
	return &device{b: b, ord: C.int(ordinal)}, nil
}

func (b *backend) PCIBusID(ordinal int) (string, error) {
	var buf [64]C.char
	if err := cudaErr("cudaDeviceGetPCIBusId", C.kolo_pci_bus_id(C.int(ordinal), &buf[0], C.int(len(buf)))); err != nil {
		return "", err // the caller names the device
	}
	return C.GoString(&buf[0]), nil
}

func (b *backend) NewUniqueID() (gpu.UniqueID, error) {
	var id gpu.UniqueID
	if r := C.kolo_unique_id((*C.char)(unsafe.Pointer(&id[0]))); r != resSuccess {
		return id, b.result("ncclGetUniqueId", 0, int(r))
	}
	return id, nil
}

func (b *backend) result(call string, comm C.uintptr_t, code int) error {
	return &ResultError{Call: call, Code: code, Detail: C.GoString(C.kolo_nccl_last_error(comm))}
}

func (b *backend) NewComm(ctx context.Context, dev gpu.Device, id gpu.UniqueID, size, rank int) (gpu.Comm, error) {
	d, ok := dev.(*device)
	if !ok {
		return nil, fmt.Errorf("nccl comm on a %T", dev)
	}
	slot := C.kolo_slot_new()
	if slot == nil {
		return nil, fmt.Errorf("rank %d of %d: no memory for the communicator", rank, size)
	}
	r := C.kolo_comm_init(d.ord, slot, C.int(size), (*C.char)(unsafe.Pointer(&id[0])), C.int(rank))
	// Every NCCL from 2.14 writes the communicator before returning, so that its state can be
	// polled; 2.14 to 2.17 keep writing through slot until set-up ends.
	h := C.kolo_slot_read(slot)
	c := &comm{b: b, dev: d, h: h, rank: rank, size: size}
	if r != resSuccess && r != resInProgress {
		if h != 0 {
			c.abort()
		}
		return nil, fmt.Errorf("rank %d of %d: %w", rank, size, b.result("ncclCommInitRankConfig", h, int(r)))
	}
	if h == 0 {
		return nil, fmt.Errorf("rank %d of %d: ncclCommInitRankConfig returned %d without a communicator", rank, size, int(r))
	}
	if err := c.settle(ctx, "ncclCommInitRankConfig"); err != nil {
		// Aborted during set-up: NCCL may still hold slot; leave it (a pointer's worth).
		return nil, fmt.Errorf("rank %d of %d: %w", rank, size, err)
	}
	C.kolo_slot_free(slot)
	return c.public(), nil
}

// public is c as the interfaces it serves: a Splitter only where the library can split.
func (c *comm) public() gpu.Comm {
	if c.b.split {
		return splitter{c}
	}
	return c
}

type device struct {
	b   *backend
	ord C.int
}

func (d *device) Alloc(n int) (gpu.Ptr, error) {
	var p C.uintptr_t
	if err := cudaErr("cudaMalloc", C.kolo_malloc(d.ord, &p, C.size_t(n))); err != nil {
		return 0, fmt.Errorf("%d bytes on device %d: %w", n, d.ord, err)
	}
	return gpu.Ptr(p), nil
}

func (d *device) Free(p gpu.Ptr) error {
	return cudaErr("cudaFree", C.kolo_free(d.ord, C.uintptr_t(p)))
}

func (d *device) NewStream() (gpu.Stream, error) {
	var h C.uintptr_t
	if err := cudaErr("cudaStreamCreateWithFlags", C.kolo_stream_create(d.ord, &h)); err != nil {
		return nil, err
	}
	return &stream{d: d, h: h, owned: true}, nil
}

func (d *device) WrapStream(handle uintptr) (gpu.Stream, error) {
	return &stream{d: d, h: C.uintptr_t(handle)}, nil
}

func (d *device) NewEvent() (gpu.Event, error) {
	var h C.uintptr_t
	if err := cudaErr("cudaEventCreateWithFlags", C.kolo_event_create(d.ord, &h)); err != nil {
		return nil, err
	}
	return &event{d: d, h: h}, nil
}

type stream struct {
	d     *device
	h     C.uintptr_t // cudaStream_t; 0 is the legacy default stream
	owned bool
}

func (s *stream) CopyAsync(dst, src gpu.Ptr, n int) error {
	return cudaErr("cudaMemcpyAsync", C.kolo_memcpy_d2d(s.d.ord, C.uintptr_t(dst), C.uintptr_t(src), C.size_t(n), s.h))
}

func (s *stream) Record(e gpu.Event) error {
	ev, ok := e.(*event)
	if !ok {
		return fmt.Errorf("cuda stream: record of a %T", e)
	}
	return cudaErr("cudaEventRecord", C.kolo_event_record(s.d.ord, ev.h, s.h))
}

func (s *stream) WaitEvent(e gpu.Event) error {
	ev, ok := e.(*event)
	if !ok {
		return fmt.Errorf("cuda stream: wait on a %T", e)
	}
	return cudaErr("cudaStreamWaitEvent", C.kolo_stream_wait_event(s.d.ord, s.h, ev.h))
}

func (s *stream) Synchronize(ctx context.Context) error {
	return poll(ctx, "cudaStreamQuery", func() C.int { return C.kolo_stream_query(s.d.ord, s.h) })
}

func (s *stream) Destroy() error {
	if !s.owned {
		return nil
	}
	return cudaErr("cudaStreamDestroy", C.kolo_stream_destroy(s.d.ord, s.h))
}

type event struct {
	d *device
	h C.uintptr_t
}

func (e *event) Query() (bool, error) {
	r := C.kolo_event_query(e.d.ord, e.h)
	if r == cudaErrorNotReady {
		return false, nil
	}
	return r == 0, cudaErr("cudaEventQuery", r)
}

func (e *event) Synchronize(ctx context.Context) error {
	return poll(ctx, "cudaEventQuery", func() C.int { return C.kolo_event_query(e.d.ord, e.h) })
}

func (e *event) Destroy() error {
	return cudaErr("cudaEventDestroy", C.kolo_event_destroy(e.d.ord, e.h))
}

// poll waits for query to stop reporting cudaErrorNotReady, spinning briefly for latency, then
// sleeping, never past ctx (cudaStreamSynchronize would block the thread with no deadline).
func poll(ctx context.Context, call string, query func() C.int) error {
	for i := 0; ; i++ {
		r := query()
		if r != cudaErrorNotReady {
			return cudaErr(call, r)
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("%s: work not done: %w", call, err)
		}
		if i > 100 {
			time.Sleep(min(time.Duration(i-100)*10*time.Microsecond, time.Millisecond))
		}
	}
}

// comm is a non-blocking NCCL communicator.
type comm struct {
	b          *backend
	dev        *device
	h          C.uintptr_t
	rank, size int

	mu      sync.Mutex
	aborted bool
	// grouped: between GroupStart and GroupEnd, mu is held by the goroutine that runs the group
	// (gpu.Group, on one thread), so that an abort waits for the group's end: NCCL would launch
	// the group's operations on the communicator the abort freed. Only that goroutine reads it.
	grouped bool
}

func (c *comm) Rank() int { return c.rank }
func (c *comm) Size() int { return c.size }

// settle polls ncclCommGetAsyncError until the communicator leaves ncclInProgress; at the deadline
// it aborts, so that NCCL never holds the engine. An abort meanwhile (halt, on another goroutine)
// ends it with ErrAborted.
func (c *comm) settle(ctx context.Context, call string) error {
	for i := 0; ; i++ {
		state, err := c.asyncState()
		if errors.Is(err, gpu.ErrAborted) {
			return fmt.Errorf("%s: %w", call, err)
		}
		if err != nil {
			c.abort()
			return err
		}
		switch {
		case state == resSuccess:
			return nil
		case state != resInProgress:
			c.abort()
			return fmt.Errorf("%s: %w", call, c.b.result("ncclCommGetAsyncError", c.h, int(state)))
		}
		if err := ctx.Err(); err != nil {
			c.abort()
			return fmt.Errorf("%s still in progress, communicator aborted: %w", call, err)
		}
		if i > 100 {
			time.Sleep(min(time.Duration(i-100)*10*time.Microsecond, time.Millisecond))
		}
	}
}

// asyncState is ncclCommGetAsyncError's state, asked under the communicator's lock: abort and
// destroy free the communicator, and they may run on another goroutine (halt, close).
func (c *comm) asyncState() (C.int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.aborted {
		return 0, gpu.ErrAborted
	}
	var state C.int
	if r := C.kolo_async_error(c.h, &state); r != resSuccess {
		return 0, c.b.result("ncclCommGetAsyncError", c.h, int(r))
	}
	return state, nil
}

// call makes NCCL call name on the communicator under its lock, unless it was aborted, and
// checks the result (enqueued).
func (c *comm) call(name string, f func() C.int) error {
	if c.grouped {
		// Inside this communicator's group, whose goroutine holds mu: NCCL only queues the
		// operation, and GroupEnd settles what the group started.
		if r := f(); r != resSuccess && r != resInProgress {
			return c.b.result(name, c.h, int(r))
		}
		return nil
	}
	c.mu.Lock()
	if c.aborted {
		c.mu.Unlock()
		return fmt.Errorf("%s: %w", name, gpu.ErrAborted)
	}
	r := f()
	c.mu.Unlock()
	return c.enqueued(name, r)
}

// enqueued checks an enqueue's result: in non-blocking mode ncclInProgress means "accepted, still
// being set up", which must settle before the next call on the communicator.
func (c *comm) enqueued(call string, r C.int) error {
	switch r {
	case resSuccess:
		return nil
	case resInProgress:
		ctx, cancel := context.WithTimeout(context.Background(), c.b.timeout)
		defer cancel()
		return c.settle(ctx, call)
	}
	return c.b.result(call, c.h, int(r))
}

func (c *comm) isAborted() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.aborted
}

func (c *comm) AllReduce(send, recv gpu.Ptr, count int, t gpu.DataType, op gpu.RedOp, s gpu.Stream) error {
	st, err := c.stream(s)
	if err != nil {
		return err
	}
	return c.call("ncclAllReduce", func() C.int {
		return C.kolo_all_reduce(c.dev.ord, C.uintptr_t(send), C.uintptr_t(recv), C.size_t(count), C.int(t), C.int(op), c.h, st)
	})
}

func (c *comm) Broadcast(send, recv gpu.Ptr, count int, t gpu.DataType, root int, s gpu.Stream) error {
	st, err := c.stream(s)
	if err != nil {
		return err
	}
	return c.call("ncclBroadcast", func() C.int {
		return C.kolo_broadcast(c.dev.ord, C.uintptr_t(send), C.uintptr_t(recv), C.size_t(count), C.int(t), C.int(root), c.h, st)
	})
}

func (c *comm) AllGather(send, recv gpu.Ptr, sendCount int, t gpu.DataType, s gpu.Stream) error {
	st, err := c.stream(s)
	if err != nil {
		return err
	}
	return c.call("ncclAllGather", func() C.int {
		return C.kolo_all_gather(c.dev.ord, C.uintptr_t(send), C.uintptr_t(recv), C.size_t(sendCount), C.int(t), c.h, st)
	})
}

func (c *comm) ReduceScatter(send, recv gpu.Ptr, recvCount int, t gpu.DataType, op gpu.RedOp, s gpu.Stream) error {
	st, err := c.stream(s)
	if err != nil {
		return err
	}
	return c.call("ncclReduceScatter", func() C.int {
		return C.kolo_reduce_scatter(c.dev.ord, C.uintptr_t(send), C.uintptr_t(recv), C.size_t(recvCount), C.int(t), C.int(op), c.h, st)
	})
}

func (c *comm) Send(buf gpu.Ptr, count int, t gpu.DataType, peer int, s gpu.Stream) error {
	st, err := c.stream(s)
	if err != nil {
		return err
	}
	return c.call("ncclSend", func() C.int {
		return C.kolo_send(c.dev.ord, C.uintptr_t(buf), C.size_t(count), C.int(t), C.int(peer), c.h, st)
	})
}

func (c *comm) Recv(buf gpu.Ptr, count int, t gpu.DataType, peer int, s gpu.Stream) error {
	st, err := c.stream(s)
	if err != nil {
		return err
	}
	return c.call("ncclRecv", func() C.int {
		return C.kolo_recv(c.dev.ord, C.uintptr_t(buf), C.size_t(count), C.int(t), C.int(peer), c.h, st)
	})
}

// GroupStart and GroupEnd are NCCL's, which are per OS thread: callers use gpu.Group, which
// keeps a group on one thread from start to end.
func (c *comm) GroupStart() error {
	c.mu.Lock()
	if c.aborted {
		c.mu.Unlock()
		return fmt.Errorf("ncclGroupStart: %w", gpu.ErrAborted)
	}
	if r := C.kolo_group_start(); r != resSuccess {
		c.mu.Unlock()
		return c.b.result("ncclGroupStart", c.h, int(r))
	}
	c.grouped = true
	return nil
}

func (c *comm) GroupEnd() error {
	if !c.grouped {
		return errors.New("ncclGroupEnd: no group started on this communicator")
	}
	r := C.kolo_group_end()
	c.grouped = false
	c.mu.Unlock()
	return c.enqueued("ncclGroupEnd", r)
}

func (c *comm) stream(s gpu.Stream) (C.uintptr_t, error) {
	st, ok := s.(*stream)
	if !ok {
		return 0, fmt.Errorf("nccl on a %T stream", s)
	}
	return st.h, nil
}

func (c *comm) AsyncError() error {
	state, err := c.asyncState()
	if err != nil {
		return err
	}
	if state != resSuccess && state != resInProgress {
		return c.b.result("ncclCommGetAsyncError", c.h, int(state))
	}
	return nil
}

func (c *comm) abort() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.aborted {
		c.aborted = true
		C.kolo_abort(c.dev.ord, c.h)
	}
}

func (c *comm) Abort() error {
	c.abort()
	return nil
}

// Destroy finalizes (flushing work in flight, bounded by the call timeout) and frees the
// communicator; a finalize that does not settle aborts it instead.
func (c *comm) Destroy() error {
	if err := c.call("ncclCommFinalize", func() C.int { return C.kolo_finalize(c.dev.ord, c.h) }); err != nil {
		c.abort()
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.aborted {
		return gpu.ErrAborted
	}
	c.aborted = true
	if r := C.kolo_destroy(c.dev.ord, c.h); r != resSuccess {
		return c.b.result("ncclCommDestroy", 0, int(r))
	}
	return nil
}

// splitter is a comm whose library has ncclCommSplit; Backend hands it out only then, so that
// "can split" is a type assertion.
type splitter struct{ *comm }

func (c splitter) Split(ctx context.Context, color, key int) (gpu.Comm, error) {
	if c.isAborted() {
		return nil, fmt.Errorf("ncclCommSplit: %w", gpu.ErrAborted)
	}
	slot := C.kolo_slot_new()
	if slot == nil {
		return nil, errors.New("ncclCommSplit: no memory for the communicator")
	}
	c.mu.Lock()
	if c.aborted {
		c.mu.Unlock()
		return nil, fmt.Errorf("ncclCommSplit: %w", gpu.ErrAborted)
	}
	r := C.kolo_comm_split(c.dev.ord, c.h, C.int(color), C.int(key), slot)
	c.mu.Unlock()
	if r != resSuccess && r != resInProgress {
		return nil, c.b.result("ncclCommSplit", c.h, int(r))
	}
	// The split runs as the parent's job: the parent reports ncclInProgress until it completed,
	// and only then does slot hold the new communicator (NCCL_COMM_NULL until then). The wait is
	// the caller's: a split involves every rank of the parent, however long they take.
	if err := c.settle(ctx, "ncclCommSplit"); err != nil {
		return nil, err // aborted: NCCL may still hold slot; leave it
	}
	h := C.kolo_slot_read(slot)
	C.kolo_slot_free(slot)
	if h == 0 {
		if color == gpu.NoColor {
			return nil, nil
		}
		return nil, fmt.Errorf("ncclCommSplit of color %d completed without a communicator", color)
	}
	sub := &comm{b: c.b, dev: c.dev, h: h}
	if err := sub.settle(ctx, "ncclCommSplit"); err != nil {
		return nil, err
	}
	// NCCL numbers the sub-communicator's ranks; ask it rather than recompute the key order.
	var rank, size C.int
	if r := C.kolo_rank_size(h, &rank, &size); r != resSuccess {
		sub.abort()
		return nil, c.b.result("ncclCommUserRank", h, int(r))
	}
	sub.rank, sub.size = int(rank), int(size)
	return sub.public(), nil
}
