package reduce

// Portable kernels: the whole job on non-amd64, under purego or KOLO_REDUCE_KERNEL=generic, and the
// sub-vector tails of every accelerated call. Results are bit-identical to the assembly (NaN payloads
// aside), which the tests check.

import (
	"math"
	"unsafe"

	"github.com/kolo-dl/kolo/internal/dtype"
)

// as views b as a slice of T. Callers pass lengths that are multiples of T's size.
func as[T any](b []byte) []T {
	var z T
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/int(unsafe.Sizeof(z)))
}

type integer interface {
	~uint8 | ~int8 | ~int16 | ~int32 | ~int64
}

type float interface {
	~float32 | ~float64
}

func intoGeneric(t dtype.DType, op Op, dst, src []byte) {
	switch t {
	case dtype.Uint8:
		intoInt(op, dst, src)
	case dtype.Int8:
		intoInt(op, as[int8](dst), as[int8](src))
	case dtype.Int16:
		intoInt(op, as[int16](dst), as[int16](src))
	case dtype.Int32:
		intoInt(op, as[int32](dst), as[int32](src))
	case dtype.Int64:
		intoInt(op, as[int64](dst), as[int64](src))
	case dtype.Float32:
		intoFloat(op, as[float32](dst), as[float32](src))
	case dtype.Float64:
		intoFloat(op, as[float64](dst), as[float64](src))
	case dtype.Float16, dtype.BFloat16:
		intoHalf(t, op, as[uint16](dst), as[uint16](src))
	default:
		panic("reduce: unreachable dtype " + t.String())
	}
}

func intoInt[T integer](op Op, d, s []T) {
	s = s[:len(d)]
	switch op {
	case Sum:
		for i := range d {
			d[i] += s[i]
		}
	case Min:
		for i := range d {
			d[i] = min(d[i], s[i])
		}
	case Max:
		for i := range d {
			d[i] = max(d[i], s[i])
		}
	case Prod:
		for i := range d {
			d[i] *= s[i]
		}
	}
}

// fmin and fmax are the package's float min/max (see the package comment); the builtins differ on
// signed zeros, so they are not used.
func fmin[T float](a, b T) T {
	if a != a {
		return a
	}
	if b != b || !(a < b) {
		return b
	}
	return a
}

func fmax[T float](a, b T) T {
	if a != a {
		return a
	}
	if b != b || !(a > b) {
		return b
	}
	return a
}

func intoFloat[T float](op Op, d, s []T) {
	s = s[:len(d)]
	switch op {
	case Sum:
		for i := range d {
			d[i] += s[i]
		}
	case Min:
		for i := range d {
			d[i] = fmin(d[i], s[i])
		}
	case Max:
		for i := range d {
			d[i] = fmax(d[i], s[i])
		}
	case Prod:
		for i := range d {
			d[i] *= s[i]
		}
	}
}

// blockElems is the float32 staging size for halves: small enough for the stack and L1.
const blockElems = 512

func intoHalf(t dtype.DType, op Op, d, s []uint16) {
	var a, b [blockElems]float32
	for len(d) > 0 {
		n := min(len(d), blockElems)
		widen(t, a[:n], d[:n])
		widen(t, b[:n], s[:n])
		intoFloat(op, a[:n], b[:n])
		narrow(t, d[:n], a[:n])
		d, s = d[n:], s[n:]
	}
}

func widen(t dtype.DType, dst []float32, src []uint16) {
	src = src[:len(dst)]
	if t == dtype.Float16 {
		for i, h := range src {
			dst[i] = Float16BitsToFloat32(h)
		}
		return
	}
	for i, h := range src {
		dst[i] = BFloat16BitsToFloat32(h)
	}
}

func narrow(t dtype.DType, dst []uint16, src []float32) {
	src = src[:len(dst)]
	if t == dtype.Float16 {
		for i, f := range src {
			dst[i] = Float32ToFloat16Bits(f)
		}
		return
	}
	for i, f := range src {
		dst[i] = Float32ToBFloat16Bits(f)
	}
}

// manyGeneric does Many from byte offset from on, block by block so that every source's block is read
// before dst's is written (dst may be a source).
func manyGeneric(t dtype.DType, op Op, dst []byte, srcs [][]byte, from int) {
	if t == dtype.Float16 || t == dtype.BFloat16 {
		var acc, x [blockElems]float32
		for off := from; off < len(dst); off += 2 * blockElems {
			end := min(len(dst), off+2*blockElems)
			n := (end - off) / 2
			widen(t, acc[:n], as[uint16](srcs[0][off:end]))
			for _, s := range srcs[1:] {
				widen(t, x[:n], as[uint16](s[off:end]))
				intoFloat(op, acc[:n], x[:n])
			}
			narrow(t, as[uint16](dst[off:end]), acc[:n])
		}
		return
	}
	var words [blockElems]uint64 // uint64 so the staging block is aligned for every element type
	block := unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), len(words)*8)
	for off := from; off < len(dst); off += len(block) {
		end := min(len(dst), off+len(block))
		acc := block[:end-off]
		copy(acc, srcs[0][off:end])
		for _, s := range srcs[1:] {
			intoGeneric(t, op, acc, s[off:end])
		}
		copy(dst[off:end], acc)
	}
}

func scaleGeneric(t dtype.DType, buf []byte, f float64) {
	switch t {
	case dtype.Float32:
		x, s := as[float32](buf), float32(f)
		for i := range x {
			x[i] *= s
		}
	case dtype.Float64:
		x := as[float64](buf)
		for i := range x {
			x[i] *= f
		}
	case dtype.Float16, dtype.BFloat16:
		var a [blockElems]float32
		x, s := as[uint16](buf), float32(f)
		for len(x) > 0 {
			n := min(len(x), blockElems)
			widen(t, a[:n], x[:n])
			for i := range a[:n] {
				a[i] *= s
			}
			narrow(t, x[:n], a[:n])
			x = x[n:]
		}
	case dtype.Uint8:
		scaleInt(buf, f, 0, math.MaxUint8)
	case dtype.Int8:
		scaleInt(as[int8](buf), f, math.MinInt8, math.MaxInt8)
	case dtype.Int16:
		scaleInt(as[int16](buf), f, math.MinInt16, math.MaxInt16)
	case dtype.Int32:
		scaleInt(as[int32](buf), f, math.MinInt32, math.MaxInt32)
	case dtype.Int64:
		scaleInt(as[int64](buf), f, math.MinInt64, math.MaxInt64)
	default:
		panic("reduce: unreachable dtype " + t.String())
	}
}

// scaleInt implements Scale's integer rules (see Scale).
func scaleInt[T integer](x []T, f float64, lo, hi T) {
	if f == math.Trunc(f) && math.Abs(f) < 1<<63 {
		m := T(int64(f)) // wraps like the product would
		for i := range x {
			x[i] *= m
		}
		return
	}
	if f != 0 && !math.IsInf(f, 0) && !math.IsNaN(f) {
		if n := math.Round(1 / f); n != 0 && math.Abs(n) < 1<<63 && 1/n == f {
			d := int64(n) // |d| >= 2: f = ±1 took the branch above
			for i := range x {
				q := int64(x[i]) / d // truncates toward zero; |q| < |x| so it fits, except below 0 for uint8
				if q < 0 && lo == 0 {
					q = 0
				}
				x[i] = T(q)
			}
			return
		}
	}
	for i := range x {
		x[i] = clampInt(math.Trunc(float64(x[i])*f), lo, hi)
	}
}

func clampInt[T integer](v float64, lo, hi T) T {
	switch {
	case v != v:
		return 0
	case v <= float64(lo):
		return lo
	case v >= float64(hi):
		return hi
	}
	return T(v)
}
