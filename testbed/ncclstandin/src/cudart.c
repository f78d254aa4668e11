// A stand-in libcudart.so.12 for tests without a GPU: device memory is host memory, a stream is
// a thread that runs its queue in order, an event is a counter a stream task completes. It keeps
// what kolo depends on: work on a stream is asynchronous and ordered; cudaStreamWaitEvent orders
// a stream after the event's latest record without blocking the host; the current device is per
// thread; cudaFree waits for all work of the device, as the real one synchronizes the device.
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "standin.h"

typedef int cudaError_t;
typedef struct stream* cudaStream_t;
typedef struct event* cudaEvent_t;

enum {
	cudaSuccess = 0,
	cudaErrorInvalidValue = 1,
	cudaErrorMemoryAllocation = 2,
	cudaErrorInvalidDevice = 101,
	cudaErrorInvalidResourceHandle = 400,
	cudaErrorNotReady = 600,
	cudaErrorLaunchTimeout = 702,
};

#define MAX_DEVICES 64
#define STREAM_MAGIC 0x57524541u
#define EVENT_MAGIC 0x45564e54u

int64_t standinNowNs(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t standinDeadlineNs(void) {
	const char* s = getenv("STANDIN_DEADLINE_S");
	int64_t v = s ? atoll(s) : 0;
	return (v > 0 ? v : 120) * 1000000000LL;
}

void standinPause(int* round) {
	int r = (*round)++;
	if (r < 100) return;
	if (r < 200) { sched_yield(); return; }
	struct timespec ts = {0, r < 1000 ? 20000 : 1000000};
	nanosleep(&ts, NULL);
}

static pthread_mutex_t reportMu = PTHREAD_MUTEX_INITIALIZER;

void standinReport(const char* fmt, ...) {
	char line[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line, sizeof line, fmt, ap);
	va_end(ap);
	pthread_mutex_lock(&reportMu);
	fprintf(stderr, "standin: %s\n", line);
	const char* path = getenv("STANDIN_REPORT");
	if (path && *path) {
		FILE* f = fopen(path, "a");
		if (f) {
			fprintf(f, "pid %d: %s\n", (int)getpid(), line);
			fclose(f);
		}
	}
	pthread_mutex_unlock(&reportMu);
}

static int deviceCount(void) {
	const char* s = getenv("STANDIN_CUDA_DEVICES");
	int n = s ? atoi(s) : 8;
	return n < 0 ? 0 : n > MAX_DEVICES ? MAX_DEVICES : n;
}

static __thread int current; // the per-thread current device, as CUDA's

struct task {
	void (*fn)(void*);
	void* arg;
	struct task* next;
};

struct stream {
	uint32_t magic;
	int dev;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct task *head, *tail;
	uint64_t enq, done;
	int stop;
	pthread_t th;
	struct stream* next; // in all
};

// all lists every stream, for cudaFree's wait on a device's work.
static pthread_mutex_t allMu = PTHREAD_MUTEX_INITIALIZER;
static struct stream* all;
static struct stream* legacy[MAX_DEVICES]; // each device's default stream (handle 0)

static void* streamMain(void* p) {
	struct stream* s = p;
	pthread_mutex_lock(&s->mu);
	for (;;) {
		while (!s->head && !s->stop) {
			// Idle: no deadline applies, a GPU stream waits for work for ever; wake now and then.
			struct timespec ts;
			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_sec++;
			pthread_cond_timedwait(&s->cv, &s->mu, &ts);
		}
		if (!s->head) break;
		struct task* t = s->head;
		s->head = t->next;
		if (!s->head) s->tail = NULL;
		pthread_mutex_unlock(&s->mu);
		t->fn(t->arg);
		free(t);
		pthread_mutex_lock(&s->mu);
		s->done++;
		pthread_cond_broadcast(&s->cv);
	}
	pthread_mutex_unlock(&s->mu);
	// Destroyed and drained: nothing refers to it any more.
	pthread_mutex_lock(&allMu);
	for (struct stream** q = &all; *q; q = &(*q)->next) {
		if (*q == s) {
			*q = s->next;
			break;
		}
	}
	pthread_mutex_unlock(&allMu);
	s->magic = 0;
	free(s);
	return NULL;
}

static struct stream* newStream(int dev) {
	struct stream* s = calloc(1, sizeof *s);
	if (!s) return NULL;
	s->magic = STREAM_MAGIC;
	s->dev = dev;
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->cv, NULL);
	if (pthread_create(&s->th, NULL, streamMain, s)) {
		free(s);
		return NULL;
	}
	pthread_detach(s->th);
	pthread_mutex_lock(&allMu);
	s->next = all;
	all = s;
	pthread_mutex_unlock(&allMu);
	return s;
}

// resolve is s, or the current device's default stream for handle 0.
static struct stream* resolve(cudaStream_t s) {
	if (s) return s->magic == STREAM_MAGIC ? s : NULL;
	pthread_mutex_lock(&allMu);
	struct stream* d = legacy[current];
	pthread_mutex_unlock(&allMu);
	if (d) return d;
	d = newStream(current);
	pthread_mutex_lock(&allMu);
	if (legacy[current]) {
		d->stop = 1; // lost the race: let it end
		pthread_cond_broadcast(&d->cv);
		d = legacy[current];
	} else {
		legacy[current] = d;
	}
	pthread_mutex_unlock(&allMu);
	return d;
}

int standinEnqueue(void* sp, void (*fn)(void*), void* arg) {
	struct stream* s = resolve(sp);
	if (!s) {
		standinReport("work enqueued on a stream that is not one (%p)", sp);
		return cudaErrorInvalidResourceHandle;
	}
	struct task* t = calloc(1, sizeof *t);
	if (!t) return cudaErrorMemoryAllocation;
	t->fn = fn;
	t->arg = arg;
	pthread_mutex_lock(&s->mu);
	if (s->stop) {
		pthread_mutex_unlock(&s->mu);
		free(t);
		standinReport("work enqueued on a destroyed stream");
		return cudaErrorInvalidResourceHandle;
	}
	if (s->tail) s->tail->next = t;
	else s->head = t;
	s->tail = t;
	s->enq++;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
	return cudaSuccess;
}

// drain waits until s has run what was enqueued before the call.
static cudaError_t drain(struct stream* s, const char* call) {
	int64_t end = standinNowNs() + standinDeadlineNs();
	pthread_mutex_lock(&s->mu);
	uint64_t target = s->enq;
	while (s->done < target) {
		if (standinNowNs() > end) {
			pthread_mutex_unlock(&s->mu);
			standinReport("%s: device %d's work not done after the stand-in's deadline", call, s->dev);
			return cudaErrorLaunchTimeout;
		}
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += 10000000;
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		pthread_cond_timedwait(&s->cv, &s->mu, &ts);
	}
	pthread_mutex_unlock(&s->mu);
	return cudaSuccess;
}

// drainDevice waits for the work of every stream of dev enqueued before the call.
static cudaError_t drainDevice(int dev, const char* call) {
	struct stream* list[1024];
	int n = 0;
	pthread_mutex_lock(&allMu);
	for (struct stream* s = all; s && n < 1024; s = s->next) {
		if (s->dev == dev && !s->stop) list[n++] = s;
	}
	pthread_mutex_unlock(&allMu);
	for (int i = 0; i < n; i++) {
		cudaError_t e = drain(list[i], call);
		if (e) return e;
	}
	return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int* n) {
	*n = deviceCount();
	return cudaSuccess;
}

cudaError_t cudaSetDevice(int dev) {
	if (dev < 0 || dev >= deviceCount()) return cudaErrorInvalidDevice;
	current = dev;
	return cudaSuccess;
}

cudaError_t cudaGetDevice(int* dev) {
	*dev = current;
	return cudaSuccess;
}

cudaError_t cudaDeviceGetPCIBusId(char* buf, int len, int dev) {
	if (dev < 0 || dev >= deviceCount()) return cudaErrorInvalidDevice;
	if (!buf || len <= 0) return cudaErrorInvalidValue;
	snprintf(buf, (size_t)len, "0000:%02x:00.0", 0x10 + dev);
	return cudaSuccess;
}

cudaError_t cudaMalloc(void** p, size_t n) {
	*p = malloc(n ? n : 1);
	return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaFree(void* p) {
	cudaError_t e = drainDevice(current, "cudaFree");
	if (e) return e; // the memory may still be in use: keep it
	free(p);
	return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) { return drainDevice(current, "cudaDeviceSynchronize"); }

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) {
	(void)flags;
	*s = newStream(current);
	return *s ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, 0); }

// cudaStreamDestroy returns at once; the stream ends once its work has run, as CUDA's does.
cudaError_t cudaStreamDestroy(cudaStream_t s) {
	if (!s || s->magic != STREAM_MAGIC) return cudaErrorInvalidResourceHandle;
	pthread_mutex_lock(&s->mu);
	s->stop = 1;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
	return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t sp) {
	struct stream* s = resolve(sp);
	if (!s) return cudaErrorInvalidResourceHandle;
	pthread_mutex_lock(&s->mu);
	int busy = s->done < s->enq;
	pthread_mutex_unlock(&s->mu);
	return busy ? cudaErrorNotReady : cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t sp) {
	struct stream* s = resolve(sp);
	return s ? drain(s, "cudaStreamSynchronize") : cudaErrorInvalidResourceHandle;
}

struct copy {
	void* dst;
	const void* src;
	size_t n;
};

static void runCopy(void* p) {
	struct copy* c = p;
	memmove(c->dst, c->src, c->n);
	free(c);
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, int kind, cudaStream_t s) {
	(void)kind;
	struct copy* c = malloc(sizeof *c);
	if (!c) return cudaErrorMemoryAllocation;
	*c = (struct copy){dst, src, n};
	cudaError_t e = standinEnqueue(s, runCopy, c);
	if (e) free(c);
	return e;
}

struct event {
	uint32_t magic;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	uint64_t recorded, completed;
};

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* ev, unsigned int flags) {
	(void)flags;
	struct event* e = calloc(1, sizeof *e);
	if (!e) return cudaErrorMemoryAllocation;
	e->magic = EVENT_MAGIC;
	pthread_mutex_init(&e->mu, NULL);
	pthread_cond_init(&e->cv, NULL);
	*ev = e;
	return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* ev) { return cudaEventCreateWithFlags(ev, 0); }

struct mark {
	struct event* e;
	uint64_t n;
};

static void runRecord(void* p) {
	struct mark* m = p;
	pthread_mutex_lock(&m->e->mu);
	if (m->e->completed < m->n) m->e->completed = m->n;
	pthread_cond_broadcast(&m->e->cv);
	pthread_mutex_unlock(&m->e->mu);
	free(m);
}

// runWait blocks its stream, not the host, until the record it captured has run.
static void runWait(void* p) {
	struct mark* m = p;
	int64_t end = standinNowNs() + standinDeadlineNs();
	pthread_mutex_lock(&m->e->mu);
	while (m->e->completed < m->n) {
		if (standinNowNs() > end) {
			standinReport("cudaStreamWaitEvent: event not reached after the stand-in's deadline");
			break;
		}
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec++;
		pthread_cond_timedwait(&m->e->cv, &m->e->mu, &ts);
	}
	pthread_mutex_unlock(&m->e->mu);
	free(m);
}

static int isEvent(cudaEvent_t e) { return e && e->magic == EVENT_MAGIC; }

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
	if (!isEvent(e)) return cudaErrorInvalidResourceHandle;
	struct mark* m = malloc(sizeof *m);
	if (!m) return cudaErrorMemoryAllocation;
	pthread_mutex_lock(&e->mu);
	m->e = e;
	m->n = ++e->recorded;
	pthread_mutex_unlock(&e->mu);
	cudaError_t r = standinEnqueue(s, runRecord, m);
	if (r) free(m);
	return r;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags) {
	(void)flags;
	if (!isEvent(e)) return cudaErrorInvalidResourceHandle;
	pthread_mutex_lock(&e->mu);
	uint64_t n = e->recorded;
	pthread_mutex_unlock(&e->mu);
	if (n == 0) return cudaSuccess; // never recorded: nothing to wait for
	struct mark* m = malloc(sizeof *m);
	if (!m) return cudaErrorMemoryAllocation;
	*m = (struct mark){e, n};
	cudaError_t r = standinEnqueue(s, runWait, m);
	if (r) free(m);
	return r;
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
	if (!isEvent(e)) return cudaErrorInvalidResourceHandle;
	pthread_mutex_lock(&e->mu);
	int busy = e->completed < e->recorded;
	pthread_mutex_unlock(&e->mu);
	return busy ? cudaErrorNotReady : cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
	if (!isEvent(e)) return cudaErrorInvalidResourceHandle;
	int64_t end = standinNowNs() + standinDeadlineNs();
	int round = 0;
	while (cudaEventQuery(e) == cudaErrorNotReady) {
		if (standinNowNs() > end) {
			standinReport("cudaEventSynchronize: not done after the stand-in's deadline");
			return cudaErrorLaunchTimeout;
		}
		standinPause(&round);
	}
	return cudaSuccess;
}

// cudaEventDestroy: a pending record or wait still refers to the event, so its memory is kept
// (as CUDA defers the release); it is no longer an event for the caller.
cudaError_t cudaEventDestroy(cudaEvent_t e) {
	if (!isEvent(e)) return cudaErrorInvalidResourceHandle;
	pthread_mutex_lock(&e->mu);
	int busy = e->completed < e->recorded;
	pthread_mutex_unlock(&e->mu);
	if (!busy) {
		e->magic = 0;
		free(e);
	}
	return cudaSuccess;
}

cudaError_t cudaGetLastError(void) { return cudaSuccess; }
cudaError_t cudaPeekAtLastError(void) { return cudaSuccess; }

cudaError_t cudaRuntimeGetVersion(int* v) {
	*v = 12040;
	return cudaSuccess;
}

const char* cudaGetErrorString(cudaError_t e) {
	switch (e) {
	case cudaSuccess: return "no error";
	case cudaErrorInvalidValue: return "invalid argument";
	case cudaErrorMemoryAllocation: return "out of memory";
	case cudaErrorInvalidDevice: return "invalid device ordinal";
	case cudaErrorInvalidResourceHandle: return "invalid resource handle";
	case cudaErrorNotReady: return "device not ready";
	case cudaErrorLaunchTimeout: return "the launch timed out and was terminated";
	}
	return "unrecognized error code";
}
