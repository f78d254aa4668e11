package e2e

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/kolo-dl/kolo"
	"github.com/kolo-dl/kolo/internal/dtype"
	"github.com/kolo-dl/kolo/internal/reduce"
)

// allreduceCheck submits one allreduce of n elements and returns its verification.
func allreduceCheck(name string, n int, t dtype.DType, ro struct {
	op      kolo.Op
	rop     reduce.Op
	average bool
}) check {
	rank, size := kolo.Rank(), kolo.Size()
	data := Encode(t, Input(name, rank, n, t, ro.rop))
	tensor := kolo.Tensor{Data: data, DType: t, Shape: []int64{int64(n)}}
	h := kolo.AllreduceAsync(name, tensor, tensor, ro.op)
	return check{h, func() error {
		want := Allreduce(name, size, n, t, ro.rop, ro.average)
		return Compare(fmt.Sprintf("allreduce %s", name), Decode(t, data), want, Tolerance(t, ro.average))
	}}
}

// opsScenario: every op x dtype x reduction at awkward sizes, submitted together so they fuse.
func opsScenario(ctx context.Context) error {
	size := kolo.Size()
	sizes := []int{0, 1, 7, 13, 1000}
	if n := 2*size + 1; !slices.Contains(sizes, n) { // not a multiple of the rank count
		sizes = append(sizes, n)
	}
	var checks []check
	for _, t := range dtype.All {
		for _, ro := range reduceOps {
			for _, n := range sizes {
				name := fmt.Sprintf("ar.%v.%v.%d", t, ro.op, n)
				checks = append(checks, allreduceCheck(name, n, t, ro))
			}
		}
		checks = append(checks, allgatherCheck(t), alltoallCheck(t), reducescatterCheck(t, reduceOps[0]), reducescatterCheck(t, reduceOps[1]))
		for root := 0; root < size; root++ {
			checks = append(checks, broadcastCheck(t, root, 11))
		}
	}
	// Pre- and post-scaling.
	{
		rank := kolo.Rank()
		name := "ar.scaled"
		data := Encode(dtype.Float32, Input(name, rank, 9, dtype.Float32, reduce.Sum))
		tensor := kolo.Tensor{Data: data, DType: dtype.Float32, Shape: []int64{9}}
		h := kolo.AllreduceAsync(name, tensor, tensor, kolo.Sum, kolo.Prescale(2), kolo.Postscale(0.25))
		checks = append(checks, check{h, func() error {
			want := Allreduce(name, size, 9, dtype.Float32, reduce.Sum, false)
			for i := range want {
				want[i] *= 0.5
			}
			return Compare(name, Decode(dtype.Float32, data), want, 1e-6)
		}})
	}
	if err := waitAll(ctx, checks); err != nil {
		return err
	}
	return kolo.Barrier(ctx)
}

// bigScenario: several MiB through every op, where chunking, rings and shared slots matter.
func bigScenario(ctx context.Context) error {
	n := 3<<20/4 + 3 // ~3 MiB of float32, not a multiple of anything nice
	var checks []check
	for _, t := range []dtype.DType{dtype.Float32, dtype.Float16, dtype.Int32} {
		checks = append(checks, allreduceCheck(fmt.Sprintf("big.%v", t), n*4/t.Size(), t, reduceOps[0]))
	}
	checks = append(checks, allreduceCheck("big.avg", n, dtype.Float32, reduceOps[1]))
	checks = append(checks, broadcastCheck(dtype.Float32, kolo.Size()-1, n))
	if err := waitAll(ctx, checks); err != nil {
		return err
	}
	return waitAll(ctx, []check{bigAllgather(ctx)})
}

func bigAllgather(ctx context.Context) check {
	rank, size := kolo.Rank(), kolo.Size()
	rows := func(r int) int { return 100000 + 1000*r }
	name := "big.allgather"
	data := Encode(dtype.Float32, Input(name, rank, rows(rank)*3, dtype.Float32, reduce.Sum))
	h := kolo.AllgatherAsync(name, kolo.Tensor{Data: data, DType: dtype.Float32, Shape: []int64{int64(rows(rank)), 3}})
	return check{h, func() error {
		var want []float64
		for r := 0; r < size; r++ {
			want = append(want, Input(name, r, rows(r)*3, dtype.Float32, reduce.Sum)...)
		}
		return Compare(name, Decode(dtype.Float32, h.Tensor().Data), want, 0)
	}}
}

func broadcastCheck(t dtype.DType, root, n int) check {
	rank := kolo.Rank()
	name := fmt.Sprintf("bc.%v.%d.%d", t, root, n)
	data := Encode(t, Input(name, rank, n, t, reduce.Sum))
	tensor := kolo.Tensor{Data: data, DType: t, Shape: []int64{int64(n)}}
	h := kolo.BroadcastAsync(name, tensor, root)
	return check{h, func() error {
		return Compare(name, Decode(t, data), Input(name, root, n, t, reduce.Sum), 0)
	}}
}

// allgatherCheck: rank r contributes (3r+1)%4 rows of 3 (some ranks contribute none).
func allgatherCheck(t dtype.DType) check {
	rank, size := kolo.Rank(), kolo.Size()
	rows := func(r int) int { return (3*r + 1) % 4 }
	name := fmt.Sprintf("ag.%v", t)
	data := Encode(t, Input(name, rank, rows(rank)*3, t, reduce.Sum))
	h := kolo.AllgatherAsync(name, kolo.Tensor{Data: data, DType: t, Shape: []int64{int64(rows(rank)), 3}})
	return check{h, func() error {
		var want []float64
		total := 0
		for r := 0; r < size; r++ {
			want = append(want, Input(name, r, rows(r)*3, t, reduce.Sum)...)
			total += rows(r)
		}
		out := h.Tensor()
		if len(out.Shape) != 2 || out.Shape[0] != int64(total) || out.Shape[1] != 3 {
			return fmt.Errorf("%s: result shape %v, want [%d 3]", name, out.Shape, total)
		}
		return Compare(name, Decode(t, out.Data), want, 0)
	}}
}

// alltoallCheck: src sends (src+2*dst)%3 rows of 2 to dst.
func alltoallCheck(t dtype.DType) check {
	rank, size := kolo.Rank(), kolo.Size()
	split := func(src, dst int) int { return (src + 2*dst) % 3 }
	name := fmt.Sprintf("a2a.%v", t)
	rowsOf := func(src int) int {
		n := 0
		for d := 0; d < size; d++ {
			n += split(src, d)
		}
		return n
	}
	splits := make([]int64, size)
	for d := range splits {
		splits[d] = int64(split(rank, d))
	}
	data := Encode(t, Input(name, rank, rowsOf(rank)*2, t, reduce.Sum))
	h := kolo.AlltoallAsync(name, kolo.Tensor{Data: data, DType: t, Shape: []int64{int64(rowsOf(rank)), 2}}, splits)
	return check{h, func() error {
		var want []float64
		for src := 0; src < size; src++ {
			in := Input(name, src, rowsOf(src)*2, t, reduce.Sum)
			off := 0
			for d := 0; d < rank; d++ {
				off += split(src, d) * 2
			}
			want = append(want, in[off:off+split(src, rank)*2]...)
		}
		got := h.RecvSplits()
		for src := 0; src < size; src++ {
			if src < len(got) && got[src] != int64(split(src, rank)) {
				return fmt.Errorf("%s: received splits %v", name, got)
			}
		}
		return Compare(name, Decode(t, h.Tensor().Data), want, 0)
	}}
}

// reducescatterCheck: dim 0 of 2n+1 rows of 2, not a multiple of the rank count.
func reducescatterCheck(t dtype.DType, ro struct {
	op      kolo.Op
	rop     reduce.Op
	average bool
}) check {
	rank, size := kolo.Rank(), kolo.Size()
	d0 := 2*size + 1
	name := fmt.Sprintf("rs.%v.%v", t, ro.op)
	data := Encode(t, Input(name, rank, d0*2, t, ro.rop))
	h := kolo.ReduceScatterAsync(name, kolo.Tensor{Data: data, DType: t, Shape: []int64{int64(d0), 2}}, ro.op)
	return check{h, func() error {
		full := Allreduce(name, size, d0*2, t, ro.rop, ro.average)
		start := 0
		for r := 0; r < rank; r++ {
			start += d0 / size
			if r < d0%size {
				start++
			}
		}
		rows := d0 / size
		if rank < d0%size {
			rows++
		}
		return Compare(name, Decode(t, h.Tensor().Data), full[start*2:(start+rows)*2], Tolerance(t, ro.average))
	}}
}

// orderScenario: every rank submits the same 60 tensors in its own random order.
func orderScenario(ctx context.Context) error {
	rank := kolo.Rank()
	idx := rand.New(rand.NewPCG(uint64(rank), 1)).Perm(60)
	var checks []check
	for _, i := range idx {
		checks = append(checks, allreduceCheck(fmt.Sprintf("order.%d", i), 1+i*37, dtype.Float32, reduceOps[0]))
	}
	return waitAll(ctx, checks)
}

// mismatchScenario: rank 1 sends a different shape, the last rank a different dtype; every rank
// must get an error naming the tensor, the ranks and what each sent, and the job must go on.
func mismatchScenario(ctx context.Context) error {
	rank, size := kolo.Rank(), kolo.Size()
	shape := []int64{4}
	if rank == 1 {
		shape = []int64{5}
	}
	data := make([]float32, shape[0])
	err := kolo.Allreduce(ctx, "bad.shape", kolo.Of(data, shape...), kolo.Sum)
	if err == nil {
		return errors.New("mismatched shapes succeeded")
	}
	for _, want := range []string{`"allreduce.bad.shape"`, "rank 1", "[5]", "[4]"} {
		if !strings.Contains(err.Error(), want) {
			return fmt.Errorf("mismatch error %q lacks %q", err, want)
		}
	}
	var d kolo.Tensor
	if rank == size-1 {
		d = kolo.Of(make([]float64, 3))
	} else {
		d = kolo.Of(make([]float32, 3))
	}
	err = kolo.Allreduce(ctx, "bad.dtype", d, kolo.Sum)
	if err == nil || !strings.Contains(err.Error(), "float64") || !strings.Contains(err.Error(), fmt.Sprintf("rank %d", size-1)) {
		return fmt.Errorf("dtype mismatch error %v does not name rank %d and float64", err, size-1)
	}
	// The job goes on.
	return waitAll(ctx, []check{allreduceCheck("after.mismatch", 10, dtype.Float32, reduceOps[0])})
}

// joinScenario: rank 0 joins at once; the others run allreduces that rank 0 contributes nothing
// to, then join. Join returns the same last rank everywhere.
func joinScenario(ctx context.Context) error {
	rank, size := kolo.Rank(), kolo.Size()
	if rank != 0 {
		for i := 0; i < 3; i++ {
			name := fmt.Sprintf("join.%d", i)
			data := Encode(dtype.Float32, Input(name, rank, 50, dtype.Float32, reduce.Sum))
			if err := kolo.Allreduce(ctx, name, kolo.Tensor{Data: data, DType: dtype.Float32, Shape: []int64{50}}, kolo.Sum); err != nil {
				return err
			}
			want := make([]float64, 50)
			for r := 1; r < size; r++ {
				for j, v := range Input(name, r, 50, dtype.Float32, reduce.Sum) {
					want[j] += v
				}
			}
			if err := Compare(name, Decode(dtype.Float32, data), want, 0); err != nil {
				return err
			}
		}
	}
	last, err := kolo.Join(ctx)
	if err != nil {
		return err
	}
	if last < 0 || last >= size || (size > 1 && last == 0) {
		return fmt.Errorf("join: last rank %d, want one of 1..%d", last, size-1)
	}
	return nil
}
