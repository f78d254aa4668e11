package reduce

// The reference: one element at a time, through encoding/binary and package math, sharing no code with
// the kernels (not even the half conversions), so that a bug in both is unlikely to cancel out.

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kolo-dl/kolo/internal/dtype"
)

var ne = binary.NativeEndian

// refF16ToF32 widens binary16 by its definition: (-1)^s * 2^(e-15) * 1.m, or 2^-14 * 0.m.
func refF16ToF32(h uint16) float64 {
	s, e, m := h>>15, int(h>>10)&0x1f, float64(h&0x3ff)
	var v float64
	switch e {
	case 0x1f:
		if m != 0 {
			return math.NaN()
		}
		v = math.Inf(1)
	case 0:
		v = math.Ldexp(m, -24)
	default:
		v = math.Ldexp(1024+m, e-25)
	}
	if s == 1 {
		v = -v
	}
	return v
}

func refBF16ToF32(h uint16) float64 {
	s, e, m := h>>15, int(h>>7)&0xff, float64(h&0x7f)
	var v float64
	switch e {
	case 0xff:
		if m != 0 {
			return math.NaN()
		}
		v = math.Inf(1)
	case 0:
		v = math.Ldexp(m, -133)
	default:
		v = math.Ldexp(128+m, e-134)
	}
	if s == 1 {
		v = -v
	}
	return v
}

// refNarrow rounds x (exactly representable in float64) to the binary format with mBits stored mantissa
// bits, exponent bias bias and eBits exponent bits: find the quantum of x's binade, round x/quantum to
// even, re-encode. NaN comes back as a canonical NaN; the comparison only checks NaN-ness.
func refNarrow(x float64, mBits, eBits, bias int) uint16 {
	var sign uint16
	if math.Signbit(x) {
		sign = 1 << (mBits + eBits)
		x = -x
	}
	inf := uint16(1<<eBits-1) << mBits
	switch {
	case math.IsNaN(x):
		return inf | 1<<(mBits-1)
	case math.IsInf(x, 0):
		return sign | inf
	case x == 0:
		return sign
	}
	_, e := math.Frexp(x) // x = fr * 2^e, fr in [0.5, 1): the binade starts at 2^(e-1)
	binade := max(e-1, 1-bias)
	q := math.Ldexp(1, binade-mBits)
	r := math.RoundToEven(x/q) * q
	if r >= math.Ldexp(1, 1<<eBits-1-bias) {
		return sign | inf
	}
	if r < math.Ldexp(1, 1-bias) { // subnormal (or the rounding left it there)
		return sign | uint16(r/math.Ldexp(1, 1-bias-mBits))
	}
	_, e = math.Frexp(r)
	m := r/math.Ldexp(1, e-1-mBits) - math.Ldexp(1, mBits)
	return sign | uint16(e-1+bias)<<mBits | uint16(m)
}

func refToF16(x float64) uint16  { return refNarrow(x, 10, 5, 15) }
func refToBF16(x float64) uint16 { return refNarrow(x, 7, 8, 127) }

func refIntOp[T uint8 | int8 | int16 | int32 | int64](op Op, a, b T) T {
	switch op {
	case Sum:
		return a + b
	case Prod:
		return a * b
	case Min:
		if b < a {
			return b
		}
		return a
	default:
		if b > a {
			return b
		}
		return a
	}
}

// refFloatOp: NaN if either is NaN (torch); ties and signed zeros go to b (the documented rule).
func refFloatOp[T float32 | float64](op Op, a, b T) T {
	switch op {
	case Sum:
		return a + b
	case Prod:
		return a * b
	}
	if a != a || b != b {
		return T(math.NaN())
	}
	if (op == Min && a < b) || (op == Max && a > b) {
		return a
	}
	return b
}

// refMany returns the reduction of srcs in order: acc = srcs[0] op srcs[1] op ...; halves in float32
// rounded once.
func refMany(t dtype.DType, op Op, srcs [][]byte) []byte {
	sz := t.Size()
	out := make([]byte, len(srcs[0]))
	for i := 0; i < len(out); i += sz {
		switch t {
		case dtype.Uint8:
			a := srcs[0][i]
			for _, s := range srcs[1:] {
				a = refIntOp(op, a, s[i])
			}
			out[i] = a
		case dtype.Int8:
			a := int8(srcs[0][i])
			for _, s := range srcs[1:] {
				a = refIntOp(op, a, int8(s[i]))
			}
			out[i] = byte(a)
		case dtype.Int16:
			a := int16(ne.Uint16(srcs[0][i:]))
			for _, s := range srcs[1:] {
				a = refIntOp(op, a, int16(ne.Uint16(s[i:])))
			}
			ne.PutUint16(out[i:], uint16(a))
		case dtype.Int32:
			a := int32(ne.Uint32(srcs[0][i:]))
			for _, s := range srcs[1:] {
				a = refIntOp(op, a, int32(ne.Uint32(s[i:])))
			}
			ne.PutUint32(out[i:], uint32(a))
		case dtype.Int64:
			a := int64(ne.Uint64(srcs[0][i:]))
			for _, s := range srcs[1:] {
				a = refIntOp(op, a, int64(ne.Uint64(s[i:])))
			}
			ne.PutUint64(out[i:], uint64(a))
		case dtype.Float32:
			a := math.Float32frombits(ne.Uint32(srcs[0][i:]))
			for _, s := range srcs[1:] {
				a = refFloatOp(op, a, math.Float32frombits(ne.Uint32(s[i:])))
			}
			ne.PutUint32(out[i:], math.Float32bits(a))
		case dtype.Float64:
			a := math.Float64frombits(ne.Uint64(srcs[0][i:]))
			for _, s := range srcs[1:] {
				a = refFloatOp(op, a, math.Float64frombits(ne.Uint64(s[i:])))
			}
			ne.PutUint64(out[i:], math.Float64bits(a))
		case dtype.Float16, dtype.BFloat16:
			widen, narrow := refF16ToF32, refToF16
			if t == dtype.BFloat16 {
				widen, narrow = refBF16ToF32, refToBF16
			}
			a := float32(widen(ne.Uint16(srcs[0][i:])))
			for _, s := range srcs[1:] {
				a = refFloatOp(op, a, float32(widen(ne.Uint16(s[i:]))))
			}
			ne.PutUint16(out[i:], narrow(float64(a)))
		}
	}
	return out
}

// sameElems compares element by element: bits must match, except that any NaN matches any NaN.
func sameElems(t *testing.T, typ dtype.DType, what string, got, want []byte) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: got %d bytes, want %d", what, len(got), len(want))
	}
	if string(got) == string(want) {
		return
	}
	sz := typ.Size()
	bad := 0
	for i := 0; i < len(got); i += sz {
		g, w := got[i:i+sz], want[i:i+sz]
		if string(g) == string(w) || (isNaN(typ, g) && isNaN(typ, w)) {
			continue
		}
		t.Errorf("%s: element %d (of %d): got %x, want %x", what, i/sz, len(got)/sz, g, w)
		if bad++; bad == 5 {
			t.FailNow()
		}
	}
}

func isNaN(t dtype.DType, b []byte) bool {
	switch t {
	case dtype.Float16:
		return ne.Uint16(b)&0x7fff > 0x7c00
	case dtype.BFloat16:
		return ne.Uint16(b)&0x7fff > 0x7f80
	case dtype.Float32:
		return ne.Uint32(b)&0x7fffffff > 0x7f800000
	case dtype.Float64:
		return ne.Uint64(b)&(1<<63-1) > 0x7ff0000000000000
	}
	return false
}

// fill writes random elements of t, salted (one in eight) with the values kernels get wrong: extremes
// and -1 for integers; NaN, ±Inf, ±0, subnormals, huge values and arbitrary bit patterns for floats.
// The rest are moderate values with fractional bits, so sums and products round. One random word per
// element keeps multi-MiB fills cheap.
func fill(rng *rand.Rand, t dtype.DType, b []byte) {
	sz := t.Size()
	for i := 0; i < len(b); i += sz {
		e, r := b[i:i+sz], rng.Uint64()
		special, pick := r&7 == 0, int(r>>3&0xff)
		switch t {
		case dtype.Uint8, dtype.Int8:
			e[0] = byte(r >> 32)
			if special {
				e[0] = []byte{0, 1, 0x7f, 0x80, 0xff}[pick%5]
			}
		case dtype.Int16:
			v := uint16(r >> 32)
			if special {
				v = []uint16{0, 1, math.MaxInt16, 1 << 15, math.MaxUint16, 0xff, 0x100}[pick%7]
			} else if r&8 == 0 {
				v = uint16(int16(r>>32)%100 - 1)
			}
			ne.PutUint16(e, v)
		case dtype.Int32:
			v := uint32(r >> 32)
			if special {
				v = []uint32{0, 1, math.MaxInt32, 1 << 31, math.MaxUint32}[pick%5]
			} else if r&8 == 0 {
				v = uint32(int32(r>>32)%100 - 1)
			}
			ne.PutUint32(e, v)
		case dtype.Int64:
			v := r
			if special {
				v = []uint64{0, 1, math.MaxInt64, 1 << 63, math.MaxUint64, 1<<32 - 1, 1 << 32}[pick%7]
			} else if r&8 == 0 {
				v = uint64(int64(r)%100 - 1)
			}
			ne.PutUint64(e, v)
		case dtype.Float16, dtype.BFloat16:
			v := uint16(r >> 32) // any bit pattern
			if !special && t == dtype.Float16 {
				v = v&0x83ff | uint16(8+r>>48&15)<<10 // 2^-7 .. 2^8
			} else if !special {
				v = v&0x807f | uint16(120+r>>48&15)<<7 // 2^-7 .. 2^8
			}
			ne.PutUint16(e, v)
		case dtype.Float32:
			f := float32(int32(r>>32)) * 0x1p-20
			if special {
				f = []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1)), 0,
					float32(math.Copysign(0, -1)), math.SmallestNonzeroFloat32, -1e-40, math.MaxFloat32,
					math.Float32frombits(uint32(r >> 32))}[pick%9]
			}
			ne.PutUint32(e, math.Float32bits(f))
		case dtype.Float64:
			f := float64(int64(r)>>8) * 0x1p-30
			if special {
				f = []float64{math.NaN(), math.Inf(1), math.Inf(-1), 0, math.Copysign(0, -1),
					math.SmallestNonzeroFloat64, -1e-310, math.MaxFloat64,
					math.Float64frombits(rng.Uint64())}[pick%9]
			}
			ne.PutUint64(e, math.Float64bits(f))
		}
	}
}
