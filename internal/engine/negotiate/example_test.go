package negotiate_test

import (
	"fmt"
	"time"

	"github.com/kolo-dl/kolo/internal/dtype"
	"github.com/kolo-dl/kolo/internal/engine/negotiate"
)

// The engine's loop, with two ranks in one process and the network replaced by byte slices: each
// rank compacts its requests through its Cache and sends a Batch to rank 0; rank 0 feeds the
// Coordinator and sends what Ready returns to every rank, which learns it and executes it.
func Example() {
	const size = 2
	co, _ := negotiate.NewCoordinator(negotiate.Config{Size: size})
	caches := make([]*negotiate.Cache, size)
	for r := range caches {
		caches[r], _ = negotiate.NewCache(r, size, 0)
	}
	grad := func(name string) negotiate.Request {
		return negotiate.Request{Name: name, Kind: negotiate.Allreduce, DType: dtype.Float32,
			Shape: []int64{1024}, ReduceOp: negotiate.ReduceSum}
	}
	now := time.Now()
	for step := 0; step < 2; step++ {
		for r := 0; r < size; r++ {
			var b negotiate.Batch
			if r == 0 {
				caches[r].Compact(&b, grad("w1"), grad("w2"))
			} else {
				caches[r].Compact(&b, grad("w2"), grad("w1")) // any order
			}
			msg := negotiate.EncodeBatch(nil, &b) // rank r -> rank 0
			got, _ := negotiate.DecodeBatch(msg)
			_ = co.SubmitBatch(now, got)
		}
		resps, _ := co.Tick(now)
		msg := negotiate.EncodeResponses(nil, resps) // rank 0 -> every rank
		fmt.Printf("step %d: %d bytes of responses\n", step, len(msg))
		for r := 0; r < size; r++ {
			got, _ := negotiate.DecodeResponses(msg)
			for i := range got {
				_ = caches[r].Learn(&got[i])
				if r == 0 {
					fmt.Printf("  execute %s %v\n", got[i].Kind, got[i].Names)
				}
			}
		}
	}
	// Output:
	// step 0: 44 bytes of responses
	//   execute allreduce [w2 w1]
	// step 1: 10 bytes of responses
	//   execute allreduce [w2 w1]
}
