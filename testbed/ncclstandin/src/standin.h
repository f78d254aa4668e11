// What the stand-in libcudart.so.12 exports to the stand-in libnccl.so.2 beyond CUDA's API: the
// stream queue NCCL's work goes on, the reports of misuse, and the deadline of every wait.
#ifndef KOLO_STANDIN_H
#define KOLO_STANDIN_H
#include <stdint.h>

// standinEnqueue puts fn(arg) on stream s (0: the calling thread's device's default stream),
// after the work already there. It returns a cudaError_t.
int standinEnqueue(void* s, void (*fn)(void*), void* arg);

// standinReport records a misuse that real NCCL or CUDA would answer with a crash, a hang or
// memory corruption: one line on stderr and in $STANDIN_REPORT (when set), which tests read.
void standinReport(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// standinNowNs is CLOCK_MONOTONIC in nanoseconds.
int64_t standinNowNs(void);

// standinDeadlineNs is how long any wait of the stand-in lasts before it gives up and reports:
// $STANDIN_DEADLINE_S seconds, 120 by default. Real NCCL and CUDA wait for ever.
int64_t standinDeadlineNs(void);

// standinPause sleeps a little longer on each call of a wait loop (spin, then up to 1 ms).
void standinPause(int* round);

#endif
