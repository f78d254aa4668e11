package engine

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/kolo-dl/kolo/internal/dtype"
	"github.com/kolo-dl/kolo/internal/engine/negotiate"
	"github.com/kolo-dl/kolo/internal/gpu"
)

// A grouped call on device memory goes in as one group (EnqueueDeviceGroup), on the fake device.
func TestDeviceGroup(t *testing.T) {
	testDeviceGroup(t, newDeviceCluster(t, 2, DefaultConfig(), nil))
}

// testDeviceGroup runs grouped calls on device memory at dc's 2 ranks: a grouped allreduce and a
// grouped allgather give the right results; a rank whose grouped call has another length fails
// every member on every rank (its members entered together: none is matched alone); a group
// with a member the device path cannot run is refused whole, and nothing of it is queued.
func testDeviceGroup(t *testing.T, dc *deviceCluster) {
	const n = 2
	dc.mustUse(t)
	errs := make([]error, n)
	group := func(name string, size int, reqs ...negotiate.Request) []negotiate.Request {
		for i := range reqs {
			reqs[i].Name = fmt.Sprintf("%s.%d", name, i)
			reqs[i].Group, reqs[i].GroupSize = int64(len(name))<<8|int64(size), size
		}
		return reqs
	}

	t.Run("allreduce", func(t *testing.T) {
		ctx := waitCtx(t)
		onEachRank(n, func(r int) {
			lens := []int{1, 3, 5}
			var reqs []negotiate.Request
			var ops []DeviceOp
			var ptrs []gpu.Ptr
			for i, l := range lens {
				vals := make([]float32, l)
				for j := range vals {
					vals[j] = float32(10*r + i + j)
				}
				p := upload(t, dc.devs[r], f32(vals...))
				ptrs = append(ptrs, p)
				reqs = append(reqs, allreduceReq("", l))
				ops = append(ops, DeviceOp{Stream: dc.streams[r], In: p, Out: p, Bytes: 4 * l})
			}
			hs := dc.engines[r].EnqueueDeviceGroup(group("ar", len(lens), reqs...), ops)
			for _, h := range hs {
				if err := h.Synchronize(ctx); err != nil {
					errs[r] = err
					return
				}
			}
			for i, l := range lens {
				got := getF32(download(t, dc.devs[r], ptrs[i], 4*l))
				for j, v := range got {
					if want := float32(10 + 2*(i+j)); v != want {
						errs[r] = fmt.Errorf("tensor %d: %v, element %d want %v", i, got, j, want)
						return
					}
				}
			}
		})
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("allgather", func(t *testing.T) {
		ctx := waitCtx(t)
		onEachRank(n, func(r int) {
			var reqs []negotiate.Request
			var ops []DeviceOp
			for i := range 2 {
				rows := r + 1 + i
				vals := make([]float32, rows)
				for j := range vals {
					vals[j] = float32(100*r + 10*i + j)
				}
				p := upload(t, dc.devs[r], f32(vals...))
				reqs = append(reqs, negotiate.Request{Kind: negotiate.Allgather, DType: dtype.Float32, Shape: []int64{int64(rows)}})
				ops = append(ops, DeviceOp{Stream: dc.streams[r], In: p, Bytes: 4 * rows})
			}
			hs := dc.engines[r].EnqueueDeviceGroup(group("ag", 2, reqs...), ops)
			for i, h := range hs {
				if err := h.Synchronize(ctx); err != nil {
					errs[r] = err
					return
				}
				p, size := h.DeviceOutput()
				got := getF32(download(t, dc.devs[r], p, size))
				if err := h.ReleaseDeviceOutput(dc.streams[r]); err != nil {
					errs[r] = err
					return
				}
				var want []float32
				for q := range n {
					for j := range q + 1 + i {
						want = append(want, float32(100*q+10*i+j))
					}
				}
				if !slices.Equal(got, want) {
					errs[r] = fmt.Errorf("member %d: %v, want %v", i, got, want)
					return
				}
			}
		})
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("lengths differ", func(t *testing.T) {
		ctx := waitCtx(t)
		// Rank 0 groups 3 tensors, rank 1 the first 2 of them: no member may complete, and none
		// waits for ever.
		onEachRank(n, func(r int) {
			size := 3 - r
			var reqs []negotiate.Request
			var ops []DeviceOp
			for range size {
				p := upload(t, dc.devs[r], f32(1, 2))
				reqs = append(reqs, allreduceReq("", 2))
				ops = append(ops, DeviceOp{Stream: dc.streams[r], In: p, Out: p, Bytes: 8})
			}
			reqs = group("mm", size, reqs...) // group ids differ, as the names of their members do
			var ok []string
			for i, h := range dc.engines[r].EnqueueDeviceGroup(reqs, ops) {
				if err := h.Synchronize(ctx); err == nil {
					ok = append(ok, reqs[i].Name)
				} else if errors.Is(err, ctx.Err()) && ctx.Err() != nil {
					errs[r] = fmt.Errorf("%s: still waiting: %w", reqs[i].Name, err)
					return
				}
			}
			if ok != nil {
				errs[r] = fmt.Errorf("group of %d: members %v completed against another rank's group of %d", size, ok, 3-(1-r))
			}
		})
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("refused whole", func(t *testing.T) {
		ctx := waitCtx(t)
		e, s := dc.engines[0], dc.streams[0]
		p := upload(t, dc.devs[0], make([]byte, 8))
		reqs := group("rf", 2, allreduceReq("", 2), negotiate.Request{Kind: negotiate.Allreduce, DType: dtype.Int16, Shape: []int64{4}})
		ops := []DeviceOp{{Stream: s, In: p, Out: p, Bytes: 8}, {Stream: s, In: p, Out: p, Bytes: 8}}
		for i, h := range e.EnqueueDeviceGroup(slices.Clone(reqs), ops) {
			err := h.Synchronize(ctx)
			var ae *ArgumentError
			if !errors.Is(err, gpu.ErrUnavailable) || !errors.As(err, &ae) {
				t.Fatalf("member %d: %v, want an ArgumentError matching gpu.ErrUnavailable", i, err)
			}
		}
		// Nothing was queued: the names are free, and the group runs on both ranks.
		onEachRank(n, func(r int) {
			p := upload(t, dc.devs[r], f32(1, float32(r)))
			q := upload(t, dc.devs[r], f32(2, 3))
			rq := group("rf", 2, allreduceReq("", 2), allreduceReq("", 2))
			ops := []DeviceOp{{Stream: dc.streams[r], In: p, Out: p, Bytes: 8}, {Stream: dc.streams[r], In: q, Out: q, Bytes: 8}}
			for _, h := range dc.engines[r].EnqueueDeviceGroup(rq, ops) {
				if err := h.Synchronize(ctx); err != nil {
					errs[r] = err
					return
				}
			}
			got := fmt.Sprint(getF32(download(t, dc.devs[r], p, 8)), getF32(download(t, dc.devs[r], q, 8)))
			if want := "[2 1] [4 6]"; got != want {
				errs[r] = fmt.Errorf("%s, want %s", got, want)
			}
		})
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
	})
}
