// Package e2e holds what the multi-process tests run inside each rank: deterministic inputs that any
// rank can recompute for every other rank, naive reference results, and the scenarios (every op x
// dtype x reduction, submit orders, mismatches, stalls, joins, a killed rank).
//
// It exists only for tests and must never be imported by the library.
package e2e

import (
	"encoding/binary"
	"fmt"
	"math"
	"strconv"

	"github.com/kolo-dl/kolo/internal/dtype"
	"github.com/kolo-dl/kolo/internal/reduce"
)

// Value is element i of tensor name on rank: a small integer, so that sums and products over up to
// 8 ranks are exact in every dtype (products stay in {-1, 1, 2}; uint8 stays non-negative).
func Value(name string, rank, i int, t dtype.DType, op reduce.Op) int64 {
	v := valueHash(name, rank, i)
	if op == reduce.Prod {
		choices := []int64{-1, 1, 2}
		if t == dtype.Uint8 {
			choices = []int64{1, 2}
		}
		return choices[v%uint64(len(choices))]
	}
	if t == dtype.Uint8 {
		return int64(v % 4)
	}
	return int64(v%7) - 3
}

// valueHash is FNV-1a of "name/rank/i", computed without fmt or an allocation: the big-tensor
// tests' references hash tens of millions of elements per rank, and fmt made them CPU-bound.
func valueHash(name string, rank, i int) uint64 {
	const offset64, prime64 = 14695981039346656037, 1099511628211
	h := uint64(offset64)
	for j := 0; j < len(name); j++ {
		h = (h ^ uint64(name[j])) * prime64
	}
	var buf [2*20 + 2]byte
	b := append(buf[:0], '/')
	b = strconv.AppendInt(b, int64(rank), 10)
	b = append(b, '/')
	b = strconv.AppendInt(b, int64(i), 10)
	for _, c := range b {
		h = (h ^ uint64(c)) * prime64
	}
	return h
}

// Encode writes integer-valued vals as elements of t.
func Encode(t dtype.DType, vals []float64) []byte {
	es := t.Size()
	b := make([]byte, len(vals)*es)
	le := binary.LittleEndian
	for i, v := range vals {
		p := b[i*es:]
		switch t {
		case dtype.Uint8:
			p[0] = byte(int64(v))
		case dtype.Int8:
			p[0] = byte(int8(int64(v)))
		case dtype.Int16:
			le.PutUint16(p, uint16(int16(int64(v))))
		case dtype.Int32:
			le.PutUint32(p, uint32(int32(int64(v))))
		case dtype.Int64:
			le.PutUint64(p, uint64(int64(v)))
		case dtype.Float16:
			le.PutUint16(p, reduce.Float32ToFloat16Bits(float32(v)))
		case dtype.BFloat16:
			le.PutUint16(p, reduce.Float32ToBFloat16Bits(float32(v)))
		case dtype.Float32:
			le.PutUint32(p, math.Float32bits(float32(v)))
		case dtype.Float64:
			le.PutUint64(p, math.Float64bits(v))
		}
	}
	return b
}

// Decode reads elements of t as float64.
func Decode(t dtype.DType, b []byte) []float64 {
	es := t.Size()
	out := make([]float64, len(b)/es)
	le := binary.LittleEndian
	for i := range out {
		p := b[i*es:]
		switch t {
		case dtype.Uint8:
			out[i] = float64(p[0])
		case dtype.Int8:
			out[i] = float64(int8(p[0]))
		case dtype.Int16:
			out[i] = float64(int16(le.Uint16(p)))
		case dtype.Int32:
			out[i] = float64(int32(le.Uint32(p)))
		case dtype.Int64:
			out[i] = float64(int64(le.Uint64(p)))
		case dtype.Float16:
			out[i] = float64(reduce.Float16BitsToFloat32(le.Uint16(p)))
		case dtype.BFloat16:
			out[i] = float64(reduce.BFloat16BitsToFloat32(le.Uint16(p)))
		case dtype.Float32:
			out[i] = float64(math.Float32frombits(le.Uint32(p)))
		case dtype.Float64:
			out[i] = math.Float64frombits(le.Uint64(p))
		}
	}
	return out
}

// Input is rank's input tensor of n elements for name.
func Input(name string, rank, n int, t dtype.DType, op reduce.Op) []float64 {
	v := make([]float64, n)
	for i := range v {
		v[i] = float64(Value(name, rank, i, t, op))
	}
	return v
}

// wrap reduces an exact integer result to what t holds (two's complement wrap for integers).
func wrap(t dtype.DType, v int64) float64 {
	switch t {
	case dtype.Uint8:
		return float64(uint8(v))
	case dtype.Int8:
		return float64(int8(v))
	case dtype.Int16:
		return float64(int16(v))
	case dtype.Int32:
		return float64(int32(v))
	}
	return float64(v)
}

// Allreduce is the naive reference: element i reduced over ranks 0..size-1, then averaged the way
// kolo defines it (floats divide; integers truncate toward zero).
func Allreduce(name string, size, n int, t dtype.DType, op reduce.Op, average bool) []float64 {
	out := make([]float64, n)
	for i := range out {
		acc := Value(name, 0, i, t, op)
		for r := 1; r < size; r++ {
			v := Value(name, r, i, t, op)
			switch op {
			case reduce.Sum:
				acc += v
			case reduce.Prod:
				acc *= v
			case reduce.Min:
				acc = min(acc, v)
			case reduce.Max:
				acc = max(acc, v)
			}
		}
		res := wrap(t, acc)
		if average {
			if t.IsFloat() {
				res = res / float64(size)
			} else {
				res = float64(int64(res) / int64(size))
			}
		}
		out[i] = res
	}
	return out
}

// Tolerance is how far a float result may be from the exact reference (average rounds).
func Tolerance(t dtype.DType, average bool) float64 {
	if !average {
		return 0
	}
	switch t {
	case dtype.Float16:
		return 4e-3
	case dtype.BFloat16:
		return 2e-2
	case dtype.Float32:
		return 1e-6
	case dtype.Float64:
		return 1e-12
	}
	return 0
}

// Compare returns an error describing the first mismatches between got and want.
func Compare(what string, got, want []float64, tol float64) error {
	if len(got) != len(want) {
		return fmt.Errorf("%s: got %d elements, want %d", what, len(got), len(want))
	}
	bad := 0
	var first string
	for i := range got {
		d := math.Abs(got[i] - want[i])
		if d > tol*math.Max(1, math.Abs(want[i])) || math.IsNaN(got[i]) {
			if bad == 0 {
				first = fmt.Sprintf("element %d = %v, want %v", i, got[i], want[i])
			}
			bad++
		}
	}
	if bad > 0 {
		return fmt.Errorf("%s: %d of %d elements wrong; first: %s", what, bad, len(got), first)
	}
	return nil
}
