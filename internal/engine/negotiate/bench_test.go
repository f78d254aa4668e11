package negotiate

import (
	"fmt"
	"testing"

	"github.com/kolo-dl/kolo/internal/dtype"
)

func modelRequests(n int) []Request {
	reqs := make([]Request, n)
	for i := range reqs {
		reqs[i] = Request{Name: fmt.Sprintf("module.layers.%d.weight.grad", i), Kind: Allreduce, DType: dtype.Float32,
			Shape: []int64{int64(64 + i), 128}, ReduceOp: ReduceSum, Average: true, PostScale: 0.125}
	}
	return reqs
}

// warmCoordinator negotiates one step of reqs in full on size ranks, so that every request has a
// cache id, and returns each rank's cache.
func warmCoordinator(b *testing.B, size int, reqs []Request) (*Coordinator, []*Cache) {
	co, err := NewCoordinator(Config{Size: size})
	if err != nil {
		b.Fatal(err)
	}
	caches := make([]*Cache, size)
	for r := range caches {
		caches[r], _ = NewCache(r, size, 0)
		if err := co.Submit(epoch, r, reqs...); err != nil {
			b.Fatal(err)
		}
	}
	for _, resp := range co.Ready() {
		for _, c := range caches {
			r := resp
			if err := c.Learn(&r); err != nil {
				b.Fatal(err)
			}
		}
	}
	return co, caches
}

// BenchmarkCoordinatorCachedStep is the coordinator's share of one steady-state step: 8 ranks each
// send the cache ids of 200 tensors, and Ready fuses them into one response.
func BenchmarkCoordinatorCachedStep(b *testing.B) {
	const size, n = 8, 200
	reqs := modelRequests(n)
	co, caches := warmCoordinator(b, size, reqs)
	batches := make([]Batch, size)
	for r := range batches {
		caches[r].Compact(&batches[r], reqs...)
		if len(batches[r].Cached) != n {
			b.Fatalf("rank %d: %d of %d requests cached", r, len(batches[r].Cached), n)
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		for r := range batches {
			batches[r].Seen = co.seq
			if err := co.SubmitBatch(epoch, &batches[r]); err != nil {
				b.Fatal(err)
			}
		}
		rs := co.Ready()
		if len(rs) != 1 || len(rs[0].Names) != n || !rs[0].FromCache {
			b.Fatalf("got %d responses", len(rs))
		}
	}
}

// BenchmarkCoordinatorFullStep is the same step with the cache off: every rank sends every request
// in full and the coordinator compares them.
func BenchmarkCoordinatorFullStep(b *testing.B) {
	const size, n = 8, 200
	reqs := modelRequests(n)
	co, err := NewCoordinator(Config{Size: size, CacheCapacity: -1})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		for r := 0; r < size; r++ {
			if err := co.Submit(epoch, r, reqs...); err != nil {
				b.Fatal(err)
			}
		}
		if rs := co.Ready(); len(rs) != 1 {
			b.Fatalf("got %d responses", len(rs))
		}
	}
}

// BenchmarkWorkerCachedStep is one rank's share: compact 200 requests, encode the batch, and on
// receiving the step's response decode it and learn (expand) it.
func BenchmarkWorkerCachedStep(b *testing.B) {
	const size, n = 8, 200
	reqs := modelRequests(n)
	co, caches := warmCoordinator(b, size, reqs)
	for r := 0; r < size; r++ {
		var batch Batch
		caches[r].Compact(&batch, reqs...)
		_ = co.SubmitBatch(epoch, &batch)
	}
	rs := co.Ready()
	respMsg := EncodeResponses(nil, rs)
	c := caches[3]
	var buf []byte
	b.ReportAllocs()
	for b.Loop() {
		batch := Batch{Cached: make([]uint32, 0, n)}
		c.Compact(&batch, reqs...)
		buf = EncodeBatch(buf[:0], &batch)
		got, err := DecodeResponses(respMsg)
		if err != nil {
			b.Fatal(err)
		}
		c.seen = got[0].Seq - 1
		if err := c.Learn(&got[0]); err != nil || len(got[0].Names) != n {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(buf)), "batch-bytes")
	b.ReportMetric(float64(len(respMsg)), "response-bytes")
}
