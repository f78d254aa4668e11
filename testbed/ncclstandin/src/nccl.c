// A stand-in libnccl.so.2 for tests without a GPU, over the stand-in libcudart.so.12. Ranks meet
// through files in $STANDIN_NCCL_DIR (default /dev/shm/kolo-standin-nccl), named after the
// communicator's unique id: a control file every rank maps (counters only, no locks, so that a
// rank killed with -9 leaves nothing held) and a data file per rank and per message.
//
// It keeps the semantics NCCL documents that a careless caller trips on:
//   - with ncclConfig_t.blocking = 0, ncclCommInitRankConfig and ncclCommSplit return
//     ncclInProgress and finish on a thread of their own; init keeps the caller's newcomm pointer
//     and writes it again when set-up ends (NCCL 2.14 to 2.17), split stores the new communicator
//     through it only when the split is complete and leaves NCCL_COMM_NULL there until then (2.18
//     on); ncclCommGetAsyncError reports ncclInProgress meanwhile (the parent's, for a split),
//     and a communicator used before it is ready is refused;
//   - group state is per OS thread (ncclGroupStart/End nest on the calling thread only; End
//     outside a group is ncclInvalidUsage); outside a group each send and receive is launched on
//     its own and blocks its stream until its peer's matching call runs;
//   - a collective blocks its stream until every rank of the communicator has reached it; a rank
//     that never does leaves the others blocked until ncclCommAbort (or the stand-in's deadline,
//     reported);
//   - calls on one communicator from two threads at once, and any call on a communicator after
//     ncclCommAbort or ncclCommDestroy (real NCCL frees it), are reported (standinReport).
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "standin.h"

#ifndef STANDIN_NCCL_VERSION
#define STANDIN_NCCL_VERSION 22304
#endif

typedef enum {
	ncclSuccess = 0,
	ncclUnhandledCudaError = 1,
	ncclSystemError = 2,
	ncclInternalError = 3,
	ncclInvalidArgument = 4,
	ncclInvalidUsage = 5,
	ncclRemoteError = 6,
	ncclInProgress = 7,
} ncclResult_t;

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
} ncclConfig_t; // the prefix every NCCL from 2.17 keeps

#define NCCL_CONFIG_UNDEF_INT INT32_MIN
#define NCCL_SPLIT_NOCOLOR -1
#define MAXR 64
#define LIVE 0x4c495645u
#define DEAD 0x44454144u
#define CTL_MAGIC 0x4e43434cu

// ctl is the control file every rank of a communicator maps. Each counter is written by one rank.
struct ctl {
	_Atomic uint32_t magic;
	_Atomic int32_t nranks;
	_Atomic uint64_t joined[MAXR];   // rank r has joined (1)
	_Atomic uint64_t posted[MAXR];   // rank r's collective number posted[r] is in its data file
	_Atomic uint64_t consumed[MAXR]; // rank r has read every rank's data of its collective n
	_Atomic uint64_t bytes[MAXR];
	_Atomic uint64_t sent[MAXR][MAXR]; // messages src -> dst written, as files
	_Atomic uint64_t taken[MAXR][MAXR]; // messages src -> dst read by dst
	_Atomic uint64_t splitPosted[MAXR];
	_Atomic uint64_t splitRead[MAXR];
	_Atomic int64_t splitColor[MAXR];
	_Atomic int64_t splitKey[MAXR];
};

struct ncclComm {
	_Atomic uint32_t magic;
	char name[160]; // files are <dir>/<name>.*: an id (128 bytes at most) and a split suffix
	int rank, nranks, dev, blocking;
	struct ctl* ctl;
	_Atomic int async;    // ncclCommGetAsyncError's answer
	_Atomic int aborted;  // ends every wait on this communicator
	_Atomic int dying;    // ncclCommAbort/Destroy under way
	_Atomic int busy;     // threads inside a call on it
	_Atomic int querying; // threads inside ncclCommGetAsyncError
	uint64_t collectives; // numbered at enqueue: every rank calls them in one order
	uint64_t sends[MAXR], recvs[MAXR];
	uint64_t splits;
	_Atomic uint64_t opsEnqueued, opsDone;
	_Atomic int connected; // its first launch has set up connections
	pthread_t job;
	_Atomic int hasJob;
	char lastError[256];
};
typedef struct ncclComm* ncclComm_t;

static __thread int groupDepth; // NCCL's thread_local ncclGroupDepth
static __thread char threadError[256];

static const char* dir(void) {
	const char* d = getenv("STANDIN_NCCL_DIR");
	return d && *d ? d : "/dev/shm/kolo-standin-nccl";
}

static void setError(struct ncclComm* c, const char* fmt, const char* what) {
	snprintf(threadError, sizeof threadError, fmt, what);
	if (c) snprintf(c->lastError, sizeof c->lastError, "%s", threadError);
}

// ---- checks every entry point makes

static int live(struct ncclComm* c, const char* call) {
	if (!c) {
		setError(NULL, "%s: NULL communicator", call);
		return 0;
	}
	uint32_t m = atomic_load(&c->magic);
	if (m == DEAD) {
		standinReport("%s on a communicator after ncclCommAbort or ncclCommDestroy (real NCCL has freed it)", call);
		setError(c, "%s: communicator already freed", call);
		return 0;
	}
	if (m != LIVE) {
		standinReport("%s on a pointer that is no communicator (%p)", call, (void*)c);
		return 0;
	}
	return 1;
}

static void enter(struct ncclComm* c, const char* call) {
	if (atomic_fetch_add(&c->busy, 1) != 0) {
		standinReport("%s: communicator rank %d of %s used from two threads at once", call, c->rank, c->name);
	}
}

static void leave(struct ncclComm* c) { atomic_fetch_sub(&c->busy, 1); }

// ready refuses a communicator whose init or split is still in progress or failed, as
// ncclCommEnsureReady does.
static ncclResult_t ready(struct ncclComm* c, const char* call) {
	int a = atomic_load(&c->async);
	if (a == ncclInProgress) {
		standinReport("%s on rank %d of %s before its set-up completed (ncclInProgress)", call, c->rank, c->name);
		setError(c, "%s: communicator not ready", call);
		return ncclInvalidUsage;
	}
	if (a != ncclSuccess) {
		setError(c, "%s: communicator in error", call);
		return ncclInvalidUsage;
	}
	if (atomic_load(&c->aborted)) return ncclInvalidUsage;
	return ncclSuccess;
}

// ---- waiting: every wait ends on abort or at the deadline

// waitFor waits until *p >= v. It returns 0, or -1 when the communicator was aborted or the
// deadline passed (reported, and the communicator set in error).
static int waitFor(struct ncclComm* c, _Atomic uint64_t* p, uint64_t v, const char* what, int peer) {
	int64_t end = standinNowNs() + standinDeadlineNs();
	int round = 0;
	while (atomic_load(p) < v) {
		if (atomic_load(&c->aborted)) return -1;
		if (standinNowNs() > end) {
			standinReport("rank %d of %s: %s: rank %d did not arrive before the stand-in's deadline",
			              c->rank, c->name, what, peer);
			atomic_store(&c->async, ncclSystemError);
			return -1;
		}
		standinPause(&round);
	}
	return 0;
}

// ---- files

static void path(char* out, size_t n, const char* name, const char* suffix) {
	snprintf(out, n, "%s/%s.%s", dir(), name, suffix);
}

static struct ctl* mapCtl(const char* name) {
	char p[512];
	mkdir(dir(), 0700);
	path(p, sizeof p, name, "ctl");
	int fd = open(p, O_RDWR | O_CREAT, 0600);
	if (fd < 0) return NULL;
	if (ftruncate(fd, sizeof(struct ctl)) != 0) { // every rank sets the same size: zeros at first
		close(fd);
		return NULL;
	}
	void* m = mmap(NULL, sizeof(struct ctl), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	return m == MAP_FAILED ? NULL : m;
}

static int writeFile(const char* p, const void* buf, size_t n) {
	char tmp[600];
	snprintf(tmp, sizeof tmp, "%s.tmp", p);
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	if (fd < 0) return -1;
	const char* b = buf;
	size_t off = 0;
	while (off < n) {
		ssize_t w = write(fd, b + off, n - off);
		if (w <= 0) {
			close(fd);
			return -1;
		}
		off += (size_t)w;
	}
	close(fd);
	return rename(tmp, p);
}

static int readFile(const char* p, void* buf, size_t off, size_t n) {
	int fd = open(p, O_RDONLY);
	if (fd < 0) return -1;
	char* b = buf;
	size_t got = 0;
	while (got < n) {
		ssize_t r = pread(fd, b + got, n - got, (off_t)(off + got));
		if (r <= 0) {
			close(fd);
			return -1;
		}
		got += (size_t)r;
	}
	close(fd);
	return 0;
}

// ---- ids, versions, errors

ncclResult_t ncclGetVersion(int* v) {
	const char* s = getenv("STANDIN_NCCL_VERSION");
	*v = s && *s ? atoi(s) : STANDIN_NCCL_VERSION;
	return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
	memset(id, 0, sizeof *id);
	unsigned char r[12];
	int fd = open("/dev/urandom", O_RDONLY);
	if (fd < 0 || read(fd, r, sizeof r) != (ssize_t)sizeof r) {
		if (fd >= 0) close(fd);
		return ncclSystemError;
	}
	close(fd);
	int n = snprintf(id->internal, sizeof id->internal, "id");
	for (size_t i = 0; i < sizeof r; i++) n += snprintf(id->internal + n, sizeof id->internal - (size_t)n, "%02x", r[i]);
	return ncclSuccess;
}

const char* ncclGetLastError(ncclComm_t c) {
	(void)c;
	return threadError;
}

const char* ncclGetErrorString(ncclResult_t r) {
	switch (r) {
	case ncclSuccess: return "no error";
	case ncclUnhandledCudaError: return "unhandled cuda error";
	case ncclSystemError: return "unhandled system error";
	case ncclInternalError: return "internal error";
	case ncclInvalidArgument: return "invalid argument";
	case ncclInvalidUsage: return "invalid usage";
	case ncclRemoteError: return "remote process exited or there was a network error";
	case ncclInProgress: return "NCCL operation in progress";
	}
	return "unknown result code";
}

// ---- communicators

extern int cudaGetDevice(int*);

static int blockingOf(const ncclConfig_t* cfg) {
	if (!cfg || cfg->blocking == NCCL_CONFIG_UNDEF_INT) return 1;
	return cfg->blocking != 0;
}

static ncclResult_t checkConfig(const ncclConfig_t* cfg, const char* call) {
	if (!cfg) return ncclSuccess;
	if (cfg->magic != 0xcafebeef || cfg->size < offsetof(ncclConfig_t, cgaClusterSize)) {
		standinReport("%s: ncclConfig_t not made by NCCL_CONFIG_INITIALIZER (magic %#x, size %zu)", call, cfg->magic, cfg->size);
		setError(NULL, "%s: bad ncclConfig_t", call);
		return ncclInvalidArgument;
	}
	return ncclSuccess;
}

static struct ncclComm* newComm(const char* name, int nranks, int rank, int blocking) {
	struct ncclComm* c = calloc(1, sizeof *c);
	if (!c) return NULL;
	snprintf(c->name, sizeof c->name, "%s", name);
	c->rank = rank;
	c->nranks = nranks;
	c->blocking = blocking;
	cudaGetDevice(&c->dev);
	c->ctl = mapCtl(name);
	if (!c->ctl) {
		free(c);
		return NULL;
	}
	atomic_store(&c->async, ncclInProgress);
	atomic_store(&c->magic, LIVE);
	return c;
}

// join is the rendezvous of init: every rank of the communicator has mapped its control file.
static ncclResult_t join(struct ncclComm* c) {
	struct ctl* k = c->ctl;
	if (atomic_exchange(&k->joined[c->rank], 1) != 0) {
		standinReport("rank %d of %s joined twice", c->rank, c->name);
		return ncclInvalidUsage;
	}
	for (int r = 0; r < c->nranks; r++) {
		if (waitFor(c, &k->joined[r], 1, "init", r)) return atomic_load(&c->aborted) ? ncclInvalidUsage : ncclSystemError;
	}
	return ncclSuccess;
}

// setupDelay keeps a non-blocking set-up in flight a little after the ranks met, as NCCL's
// connection set-up does, so that a caller reading too early reads too early every time.
static void setupDelay(void) {
	struct timespec ts = {0, 20 * 1000000};
	nanosleep(&ts, NULL);
}

struct initJob {
	struct ncclComm* c;
	ncclComm_t* newcomm;
};

static void* initMain(void* p) {
	struct initJob* j = p;
	struct ncclComm* c = j->c;
	ncclResult_t r = join(c);
	if (r == ncclSuccess) setupDelay();
	// NCCL 2.14-2.17's init thread reads the communicator through the caller's pointer during
	// set-up and writes it (NULL on failure) when done.
	ncclComm_t seen = __atomic_load_n(j->newcomm, __ATOMIC_ACQUIRE);
	if (seen != c) {
		standinReport("ncclCommInitRankConfig: rank %d of %s: *newcomm changed while init was in flight (%p, not %p): "
		              "the caller's storage was reused before set-up completed", c->rank, c->name, (void*)seen, (void*)c);
		r = ncclInvalidUsage;
	} else {
		__atomic_store_n(j->newcomm, r == ncclSuccess ? c : NULL, __ATOMIC_RELEASE);
	}
	free(j);
	atomic_store(&c->async, r);
	return NULL;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* newcomm, int nranks, ncclUniqueId id, int rank, ncclConfig_t* cfg) {
	ncclResult_t r = checkConfig(cfg, "ncclCommInitRankConfig");
	if (r) return r;
	if (nranks < 1 || nranks > MAXR || rank < 0 || rank >= nranks || !newcomm) {
		setError(NULL, "%s: bad arguments", "ncclCommInitRankConfig");
		return ncclInvalidArgument;
	}
	id.internal[sizeof id.internal - 1] = 0;
	struct ncclComm* c = newComm(id.internal, nranks, rank, blockingOf(cfg));
	if (!c) return ncclSystemError;
	atomic_store(&c->ctl->nranks, nranks);
	*newcomm = c;
	if (c->blocking) {
		r = join(c);
		atomic_store(&c->async, r);
		if (r) *newcomm = NULL;
		return r;
	}
	struct initJob* j = malloc(sizeof *j);
	*j = (struct initJob){c, newcomm};
	atomic_store(&c->hasJob, 1);
	if (pthread_create(&c->job, NULL, initMain, j)) return ncclSystemError;
	return ncclInProgress;
}

ncclResult_t ncclCommInitRank(ncclComm_t* newcomm, int nranks, ncclUniqueId id, int rank) {
	return ncclCommInitRankConfig(newcomm, nranks, id, rank, NULL);
}

#ifndef STANDIN_NO_SPLIT // NCCL before 2.18 has no ncclCommSplit
struct splitJob {
	struct ncclComm* parent;
	int color, key, blocking;
	ncclComm_t* newcomm;
	uint64_t seq;
	int dev;
};

// split exchanges color and key over the parent's control file and joins the child.
static ncclResult_t split(struct splitJob* j, struct ncclComm** out) {
	struct ncclComm* p = j->parent;
	struct ctl* k = p->ctl;
	*out = NULL;
	for (int r = 0; r < p->nranks; r++) { // the previous split's slots have been read
		if (waitFor(p, &k->splitRead[r], j->seq - 1, "ncclCommSplit", r)) return ncclSystemError;
	}
	atomic_store(&k->splitColor[p->rank], j->color);
	atomic_store(&k->splitKey[p->rank], j->key);
	atomic_store(&k->splitPosted[p->rank], j->seq);
	int64_t color[MAXR], key[MAXR];
	for (int r = 0; r < p->nranks; r++) {
		if (waitFor(p, &k->splitPosted[r], j->seq, "ncclCommSplit", r)) return ncclSystemError;
		color[r] = atomic_load(&k->splitColor[r]);
		key[r] = atomic_load(&k->splitKey[r]);
	}
	atomic_store(&k->splitRead[p->rank], j->seq);
	if (j->color == NCCL_SPLIT_NOCOLOR) return ncclSuccess;
	int n = 0, rank = 0;
	for (int r = 0; r < p->nranks; r++) {
		if (color[r] != j->color) continue;
		n++;
		if (key[r] < j->key || (key[r] == j->key && r < p->rank)) rank++;
	}
	char name[96];
	snprintf(name, sizeof name, "%.60s-s%llu-c%d", p->name, (unsigned long long)j->seq, j->color);
	struct ncclComm* c = newComm(name, n, rank, j->blocking);
	if (!c) return ncclSystemError;
	c->dev = j->dev;
	ncclResult_t r = join(c);
	atomic_store(&c->async, r);
	if (r) {
		atomic_store(&c->magic, DEAD);
		return r;
	}
	*out = c;
	return ncclSuccess;
}

static void* splitMain(void* v) {
	struct splitJob* j = v;
	struct ncclComm* c = NULL;
	ncclResult_t r = split(j, &c);
	if (r == ncclSuccess) setupDelay();
	// "*newcomm should be NCCL_COMM_NULL until comm split fully complete": the store happens
	// here, on this thread, into the caller's memory.
	ncclComm_t seen = __atomic_load_n(j->newcomm, __ATOMIC_ACQUIRE);
	if (seen != NULL) {
		standinReport("ncclCommSplit: rank %d of %s: *newcomm changed while the split was in flight (%p): "
		              "the caller's storage was reused before the split completed", j->parent->rank, j->parent->name, (void*)seen);
		r = ncclInvalidUsage;
	}
	__atomic_store_n(j->newcomm, c, __ATOMIC_RELEASE);
	atomic_store(&j->parent->async, r);
	free(j);
	return NULL;
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* cfg) {
	if (!live(comm, "ncclCommSplit")) return ncclInvalidArgument;
	ncclResult_t r = checkConfig(cfg, "ncclCommSplit");
	if (r) return r;
	enter(comm, "ncclCommSplit");
	if ((r = ready(comm, "ncclCommSplit"))) {
		leave(comm);
		return r;
	}
	*newcomm = NULL;
	struct splitJob* j = malloc(sizeof *j);
	*j = (struct splitJob){comm, color, key, cfg ? blockingOf(cfg) : comm->blocking, newcomm, ++comm->splits, comm->dev};
	if (comm->blocking) {
		struct ncclComm* c = NULL;
		r = split(j, &c);
		*newcomm = c;
		free(j);
		leave(comm);
		return r;
	}
	atomic_store(&comm->async, ncclInProgress);
	if (atomic_load(&comm->hasJob)) pthread_join(comm->job, NULL);
	atomic_store(&comm->hasJob, 1);
	if (pthread_create(&comm->job, NULL, splitMain, j)) {
		leave(comm);
		return ncclSystemError;
	}
	leave(comm);
	return ncclInProgress;
}
#endif

ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t* state) {
	if (!live(c, "ncclCommGetAsyncError")) return ncclInvalidArgument;
	atomic_fetch_add(&c->querying, 1);
	if (atomic_load(&c->dying)) {
		standinReport("ncclCommGetAsyncError on rank %d of %s while it is being aborted or destroyed on another thread "
		              "(real NCCL frees it under the reader)", c->rank, c->name);
	}
	// A library's stack frame: what a caller's C stack local left here does not survive.
	volatile char scratch[2048];
	memset((char*)scratch, 0x5a, sizeof scratch);
	*state = atomic_load(&c->async);
	sched_yield();
	atomic_fetch_sub(&c->querying, 1);
	return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t c, int* n) {
	if (!live(c, "ncclCommCount")) return ncclInvalidArgument;
	ncclResult_t r = ready(c, "ncclCommCount");
	if (r) return r;
	*n = c->nranks;
	return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t c, int* rank) {
	if (!live(c, "ncclCommUserRank")) return ncclInvalidArgument;
	ncclResult_t r = ready(c, "ncclCommUserRank");
	if (r) return r;
	*rank = c->rank;
	return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t c, int* dev) {
	if (!live(c, "ncclCommCuDevice")) return ncclInvalidArgument;
	*dev = c->dev;
	return ncclSuccess;
}

// onDevice reports a clean-up call made with another device current than the communicator's:
// real NCCL's clean-up then works on, and may create a context on, the thread's device.
static void onDevice(struct ncclComm* c, const char* call) {
	int cur = -1;
	cudaGetDevice(&cur);
	if (cur != c->dev) {
		standinReport("%s on rank %d of %s with device %d current, not the communicator's %d", call, c->rank, c->name, cur, c->dev);
	}
}

// kill ends the communicator: every wait on it returns, its set-up thread is joined, and it is
// marked freed (its memory is kept, so that a later use is reported rather than undefined).
static void kill(struct ncclComm* c, const char* call) {
	atomic_store(&c->dying, 1);
	if (atomic_load(&c->querying)) {
		standinReport("%s on rank %d of %s while another thread is in ncclCommGetAsyncError on it "
		              "(real NCCL frees it under the reader)", call, c->rank, c->name);
	}
	atomic_store(&c->aborted, 1);
	if (atomic_exchange(&c->hasJob, 0)) pthread_join(c->job, NULL);
	atomic_store(&c->magic, DEAD);
}

ncclResult_t ncclCommAbort(ncclComm_t c) {
	if (!c) return ncclSuccess;
	if (!live(c, "ncclCommAbort")) return ncclInvalidArgument;
	onDevice(c, "ncclCommAbort");
	kill(c, "ncclCommAbort");
	return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t c) {
	if (!c) return ncclSuccess;
	if (!live(c, "ncclCommDestroy")) return ncclInvalidArgument;
	onDevice(c, "ncclCommDestroy");
	enter(c, "ncclCommDestroy");
	if (atomic_load(&c->opsDone) < atomic_load(&c->opsEnqueued)) {
		standinReport("ncclCommDestroy on rank %d of %s with work in flight (ncclCommFinalize first)", c->rank, c->name);
	}
	leave(c);
	kill(c, "ncclCommDestroy");
	return ncclSuccess;
}

static void* finalizeMain(void* v) {
	struct ncclComm* c = v;
	int64_t end = standinNowNs() + standinDeadlineNs();
	int round = 0;
	while (atomic_load(&c->opsDone) < atomic_load(&c->opsEnqueued)) {
		if (atomic_load(&c->aborted)) return NULL;
		if (standinNowNs() > end) {
			standinReport("ncclCommFinalize: rank %d of %s: work not done before the stand-in's deadline", c->rank, c->name);
			atomic_store(&c->async, ncclSystemError);
			return NULL;
		}
		standinPause(&round);
	}
	atomic_store(&c->async, ncclSuccess);
	return NULL;
}

ncclResult_t ncclCommFinalize(ncclComm_t c) {
	if (!live(c, "ncclCommFinalize")) return ncclInvalidArgument;
	onDevice(c, "ncclCommFinalize");
	enter(c, "ncclCommFinalize");
	ncclResult_t r = ready(c, "ncclCommFinalize");
	if (r) {
		leave(c);
		return r;
	}
	if (c->blocking) {
		finalizeMain(c);
		leave(c);
		return atomic_load(&c->async);
	}
	atomic_store(&c->async, ncclInProgress);
	if (atomic_exchange(&c->hasJob, 0)) pthread_join(c->job, NULL);
	atomic_store(&c->hasJob, 1);
	if (pthread_create(&c->job, NULL, finalizeMain, c)) r = ncclSystemError;
	leave(c);
	return r ? r : ncclInProgress;
}

// ---- operations

enum kind { ALLREDUCE, BROADCAST, ALLGATHER, REDUCESCATTER, SEND, RECV };

struct op {
	enum kind kind;
	const void* send;
	void* recv;
	size_t count;
	int type, redop, peer; // peer: a broadcast's root, a send's or receive's peer
	struct ncclComm* c;
	void* stream;
	uint64_t seq;
	struct op* next;
};

static size_t typeSize(int t) {
	switch (t) {
	case 0: case 1: return 1;      // int8, uint8
	case 2: case 3: return 4;      // int32, uint32
	case 4: case 5: return 8;      // int64, uint64
	case 6: return 2;              // float16
	case 7: return 4;              // float32
	case 8: return 8;              // float64
	case 9: return 2;              // bfloat16
	}
	return 0;
}

static float halfToFloat(uint16_t h) {
	uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 0x1f, m = h & 0x3ff, f;
	if (e == 0) {
		if (m == 0) f = s;
		else {
			e = 127 - 15 + 1;
			while (!(m & 0x400)) { m <<= 1; e--; }
			f = s | (e << 23) | ((m & 0x3ff) << 13);
		}
	} else if (e == 31) f = s | 0x7f800000 | (m << 13);
	else f = s | ((e - 15 + 127) << 23) | (m << 13);
	float x;
	memcpy(&x, &f, 4);
	return x;
}

static uint16_t floatToHalf(float x) {
	uint32_t f;
	memcpy(&f, &x, 4);
	uint32_t s = (f >> 16) & 0x8000;
	int e = (int)((f >> 23) & 0xff) - 127 + 15;
	uint32_t m = f & 0x7fffff;
	if (((f >> 23) & 0xff) == 0xff) return (uint16_t)(s | 0x7c00 | (m ? 0x200 : 0));
	if (e >= 31) return (uint16_t)(s | 0x7c00);
	if (e <= 0) {
		if (e < -10) return (uint16_t)s;
		m |= 0x800000;
		uint32_t shift = (uint32_t)(14 - e);
		uint32_t h = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
		if (rem > half || (rem == half && (h & 1))) h++;
		return (uint16_t)(s | h);
	}
	uint32_t h = s | ((uint32_t)e << 10) | (m >> 13), rem = m & 0x1fff;
	if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
	return (uint16_t)h;
}

static float bf16ToFloat(uint16_t b) {
	uint32_t f = (uint32_t)b << 16;
	float x;
	memcpy(&x, &f, 4);
	return x;
}

static uint16_t floatToBf16(float x) {
	uint32_t f;
	memcpy(&f, &x, 4);
	if ((f & 0x7fffffff) > 0x7f800000) return (uint16_t)((f >> 16) | 0x40);
	return (uint16_t)((f + 0x7fff + ((f >> 16) & 1)) >> 16);
}

#define RED(T) do { \
	T* a = (T*)acc; const T* b = (const T*)in; \
	for (size_t i = 0; i < n; i++) switch (op) { \
	case 0: case 4: a[i] = (T)(a[i] + b[i]); break; \
	case 1: a[i] = (T)(a[i] * b[i]); break; \
	case 2: if (b[i] > a[i]) a[i] = b[i]; break; \
	case 3: if (b[i] < a[i]) a[i] = b[i]; break; } \
	} while (0)

#define HALF(TOF, FROMF) do { \
	uint16_t* a = acc; const uint16_t* b = in; \
	for (size_t i = 0; i < n; i++) { float x = TOF(a[i]), y = TOF(b[i]), z = x; \
		switch (op) { case 0: case 4: z = x + y; break; case 1: z = x * y; break; \
		case 2: z = y > x ? y : x; break; case 3: z = y < x ? y : x; break; } \
		a[i] = FROMF(z); } \
	} while (0)

static void reduce(void* acc, const void* in, size_t n, int t, int op) {
	switch (t) {
	case 0: RED(int8_t); break;
	case 1: RED(uint8_t); break;
	case 2: RED(int32_t); break;
	case 3: RED(uint32_t); break;
	case 4: RED(int64_t); break;
	case 5: RED(uint64_t); break;
	case 6: HALF(halfToFloat, floatToHalf); break;
	case 7: RED(float); break;
	case 8: RED(double); break;
	case 9: HALF(bf16ToFloat, floatToBf16); break;
	}
}

#define AVG(T) do { T* a = (T*)acc; for (size_t i = 0; i < n; i++) a[i] = (T)(a[i] / k); } while (0)
#define HAVG(TOF, FROMF) do { uint16_t* a = acc; for (size_t i = 0; i < n; i++) a[i] = FROMF(TOF(a[i]) / (float)k); } while (0)

static void average(void* acc, size_t n, int t, int k) {
	switch (t) {
	case 0: AVG(int8_t); break;
	case 1: AVG(uint8_t); break;
	case 2: AVG(int32_t); break;
	case 3: AVG(uint32_t); break;
	case 4: AVG(int64_t); break;
	case 5: AVG(uint64_t); break;
	case 6: HAVG(halfToFloat, floatToHalf); break;
	case 7: AVG(float); break;
	case 8: AVG(double); break;
	case 9: HAVG(bf16ToFloat, floatToBf16); break;
	}
}

static void dataPath(char* out, size_t n, struct ncclComm* c, int rank) {
	char suffix[32];
	snprintf(suffix, sizeof suffix, "r%d", rank);
	path(out, n, c->name, suffix);
}

// collective runs one collective o on its stream's thread: publish this rank's data, wait for
// every rank's, compute, then mark it read so that the next collective may overwrite.
static void collective(struct op* o) {
	struct ncclComm* c = o->c;
	struct ctl* k = c->ctl;
	size_t ts = typeSize(o->type), n = o->count * ts;
	size_t in = o->kind == REDUCESCATTER ? n * (size_t)c->nranks : n; // bytes each rank publishes
	size_t out = o->kind == ALLGATHER ? n * (size_t)c->nranks : n;
	char p[600];
	for (int r = 0; r < c->nranks; r++) {
		if (waitFor(c, &k->consumed[r], o->seq - 1, "a collective", r)) return;
	}
	int publish = o->kind != BROADCAST || o->peer == c->rank;
	if (publish) {
		dataPath(p, sizeof p, c, c->rank);
		if (writeFile(p, o->send, in)) {
			standinReport("rank %d of %s: cannot write %s", c->rank, c->name, p);
			atomic_store(&c->async, ncclSystemError);
			return;
		}
	}
	atomic_store(&k->bytes[c->rank], in);
	atomic_store(&k->posted[c->rank], o->seq);
	for (int r = 0; r < c->nranks; r++) {
		if (waitFor(c, &k->posted[r], o->seq, "a collective", r)) return;
	}
	char* result = malloc(out ? out : 1);
	char* tmp = malloc(n ? n : 1);
	int bad = 0;
	for (int r = 0; r < c->nranks && !bad; r++) {
		if (atomic_load(&k->bytes[r]) != in) {
			standinReport("rank %d of %s: ranks %d and %d disagree on a collective's size (%zu, %llu bytes)", c->rank,
			              c->name, c->rank, r, in, (unsigned long long)atomic_load(&k->bytes[r]));
			bad = 1;
			break;
		}
		dataPath(p, sizeof p, c, r);
		switch (o->kind) {
		case ALLREDUCE:
			bad = readFile(p, r ? tmp : result, 0, n);
			if (r && !bad) reduce(result, tmp, o->count, o->type, o->redop);
			break;
		case REDUCESCATTER:
			bad = readFile(p, r ? tmp : result, (size_t)c->rank * n, n);
			if (r && !bad) reduce(result, tmp, o->count, o->type, o->redop);
			break;
		case ALLGATHER:
			bad = readFile(p, result + (size_t)r * n, 0, n);
			break;
		case BROADCAST:
			if (r == o->peer) bad = readFile(p, result, 0, n);
			break;
		default:
			break;
		}
	}
	if (bad) {
		standinReport("rank %d of %s: a collective's data could not be read", c->rank, c->name);
		atomic_store(&c->async, ncclSystemError);
	} else {
		if (o->redop == 4 && (o->kind == ALLREDUCE || o->kind == REDUCESCATTER)) average(result, o->count, o->type, c->nranks);
		memcpy(o->recv, result, out);
	}
	free(result);
	free(tmp);
	atomic_store(&k->consumed[c->rank], o->seq);
}

static void msgPath(char* out, size_t n, struct ncclComm* c, int src, int dst, uint64_t seq) {
	char suffix[64];
	snprintf(suffix, sizeof suffix, "m%d-%d-%llu", src, dst, (unsigned long long)seq);
	path(out, n, c->name, suffix);
}

static void post(struct op* o) {
	struct ncclComm* c = o->c;
	char p[600];
	msgPath(p, sizeof p, c, c->rank, o->peer, o->seq);
	if (writeFile(p, o->send, o->count * typeSize(o->type))) {
		standinReport("rank %d of %s: cannot write %s", c->rank, c->name, p);
		atomic_store(&c->async, ncclSystemError);
		return;
	}
	atomic_store(&c->ctl->sent[c->rank][o->peer], o->seq);
}

static void take(struct op* o) {
	struct ncclComm* c = o->c;
	if (waitFor(c, &c->ctl->sent[o->peer][c->rank], o->seq, "a receive", o->peer)) return;
	char p[600];
	msgPath(p, sizeof p, c, o->peer, c->rank, o->seq);
	struct stat st;
	size_t n = o->count * typeSize(o->type);
	if (stat(p, &st) || (size_t)st.st_size != n) {
		standinReport("rank %d of %s: receive of %zu bytes from rank %d, which sent %lld", c->rank, c->name, n, o->peer,
		              (long long)st.st_size);
		atomic_store(&c->async, ncclSystemError);
	} else if (readFile(p, o->recv, 0, n)) {
		atomic_store(&c->async, ncclSystemError);
	}
	unlink(p);
	atomic_store(&c->ctl->taken[o->peer][c->rank], o->seq);
}

// sent waits until the peer has taken o: a send completes only with its receive.
static void delivered(struct op* o) {
	struct ncclComm* c = o->c;
	waitFor(c, &c->ctl->taken[c->rank][o->peer], o->seq, "a send", o->peer);
}

// runOps runs a launch (one operation, or a group's operations on one stream) as one kernel:
// collectives in order, then every send is posted before any receive waits.
static void runOps(void* v) {
	struct op* ops = v;
	for (struct op* o = ops; o; o = o->next) {
		if (atomic_load(&o->c->aborted)) continue;
		if (o->kind <= REDUCESCATTER) collective(o);
	}
	for (struct op* o = ops; o; o = o->next) if (o->kind == SEND && !atomic_load(&o->c->aborted)) post(o);
	for (struct op* o = ops; o; o = o->next) if (o->kind == RECV && !atomic_load(&o->c->aborted)) take(o);
	for (struct op* o = ops; o; o = o->next) if (o->kind == SEND && !atomic_load(&o->c->aborted)) delivered(o);
	while (ops) {
		struct op* next = ops->next;
		atomic_fetch_add(&ops->c->opsDone, 1);
		free(ops);
		ops = next;
	}
}

static __thread struct op *groupHead, *groupTail; // the calling thread's group

static void* connectMain(void* v) {
	struct ncclComm* c = v;
	struct timespec ts = {0, 5 * 1000000};
	nanosleep(&ts, NULL);
	int busy = ncclInProgress;
	atomic_compare_exchange_strong(&c->async, &busy, ncclSuccess);
	return NULL;
}

// launch puts ops on their stream. A non-blocking communicator's first launch connects its
// peers on a thread of its own and reports ncclInProgress, as NCCL does: the caller polls
// ncclCommGetAsyncError until ncclSuccess before its next call on the communicator.
static ncclResult_t launch(struct op* ops) {
	struct ncclComm* c = ops->c;
	int e = standinEnqueue(ops->stream, runOps, ops);
	if (e) {
		setError(c, "%s: stream refused the work", "launch");
		return ncclUnhandledCudaError;
	}
	if (!c->blocking && !atomic_exchange(&c->connected, 1)) {
		atomic_store(&c->async, ncclInProgress);
		pthread_t th;
		if (pthread_create(&th, NULL, connectMain, c) == 0) {
			pthread_detach(th);
			return ncclInProgress;
		}
		atomic_store(&c->async, ncclSuccess);
	}
	return ncclSuccess;
}

static ncclResult_t enqueue(enum kind kind, const void* send, void* recv, size_t count, int type, int redop, int peer,
                            ncclComm_t c, void* stream, const char* call) {
	if (!live(c, call)) return ncclInvalidArgument;
	enter(c, call);
	ncclResult_t r = ready(c, call);
	if (!r && typeSize(type) == 0) {
		setError(c, "%s: bad data type", call);
		r = ncclInvalidArgument;
	}
	if (!r && (kind == SEND || kind == RECV || kind == BROADCAST) && (peer < 0 || peer >= c->nranks)) {
		setError(c, "%s: bad peer or root", call);
		r = ncclInvalidArgument;
	}
	if (r) {
		leave(c);
		return r;
	}
	struct op* o = calloc(1, sizeof *o);
	*o = (struct op){kind, send, recv, count, type, redop, peer, c, stream, 0, NULL};
	switch (kind) {
	case SEND: o->seq = ++c->sends[peer]; break;
	case RECV: o->seq = ++c->recvs[peer]; break;
	default: o->seq = ++c->collectives;
	}
	atomic_fetch_add(&c->opsEnqueued, 1);
	if (groupDepth > 0) {
		if (groupTail) groupTail->next = o;
		else groupHead = o;
		groupTail = o;
	} else {
		r = launch(o);
	}
	leave(c);
	return r;
}

ncclResult_t ncclAllReduce(const void* s, void* r, size_t n, int t, int op, ncclComm_t c, void* st) {
	return enqueue(ALLREDUCE, s, r, n, t, op, 0, c, st, "ncclAllReduce");
}
ncclResult_t ncclBroadcast(const void* s, void* r, size_t n, int t, int root, ncclComm_t c, void* st) {
	return enqueue(BROADCAST, s, r, n, t, 0, root, c, st, "ncclBroadcast");
}
ncclResult_t ncclAllGather(const void* s, void* r, size_t n, int t, ncclComm_t c, void* st) {
	return enqueue(ALLGATHER, s, r, n, t, 0, 0, c, st, "ncclAllGather");
}
ncclResult_t ncclReduceScatter(const void* s, void* r, size_t n, int t, int op, ncclComm_t c, void* st) {
	return enqueue(REDUCESCATTER, s, r, n, t, op, 0, c, st, "ncclReduceScatter");
}
ncclResult_t ncclSend(const void* s, size_t n, int t, int peer, ncclComm_t c, void* st) {
	return enqueue(SEND, s, NULL, n, t, 0, peer, c, st, "ncclSend");
}
ncclResult_t ncclRecv(void* r, size_t n, int t, int peer, ncclComm_t c, void* st) {
	return enqueue(RECV, NULL, r, n, t, 0, peer, c, st, "ncclRecv");
}

ncclResult_t ncclGroupStart(void) {
	groupDepth++;
	return ncclSuccess;
}

// ncclGroupEnd launches the thread's group: one launch per stream, in call order.
ncclResult_t ncclGroupEnd(void) {
	if (groupDepth == 0) {
		setError(NULL, "%s: not in a group call", "ncclGroupEnd");
		return ncclInvalidUsage;
	}
	if (--groupDepth > 0) return ncclSuccess;
	ncclResult_t r = ncclSuccess;
	for (struct op* o = groupHead; o; o = o->next) {
		if (atomic_load(&o->c->magic) != LIVE) {
			standinReport("ncclGroupEnd: an operation of the group is on rank %d of %s, aborted or destroyed since it "
			              "was enqueued (real NCCL has freed it)", o->c->rank, o->c->name);
			setError(o->c, "%s: communicator freed within the group", "ncclGroupEnd");
			r = ncclInvalidUsage;
		}
	}
	while (groupHead) {
		void* st = groupHead->stream;
		struct op *mine = NULL, *mineTail = NULL, *rest = NULL, *restTail = NULL;
		for (struct op* o = groupHead; o;) {
			struct op* next = o->next;
			o->next = NULL;
			struct op** h = o->stream == st ? &mine : &rest;
			struct op** t = o->stream == st ? &mineTail : &restTail;
			if (*t) (*t)->next = o;
			else *h = o;
			*t = o;
			o = next;
		}
		groupHead = rest;
		ncclResult_t e = launch(mine);
		if (e && (!r || r == ncclInProgress)) r = e;
	}
	groupTail = NULL;
	return r;
}
