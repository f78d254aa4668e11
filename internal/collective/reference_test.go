package collective

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/kolo-dl/kolo/internal/dtype"
	"github.com/kolo-dl/kolo/internal/reduce"
)

// The naive reference: element loops over encoding/binary and math, in float64 for floats, so
// that it shares no code with the kernels it checks.

var le = binary.LittleEndian // the machines kolo runs on are little-endian

// halfToFloat decodes IEEE binary16 bits.
func halfToFloat(h uint16) float64 {
	sign := 1.0
	if h&0x8000 != 0 {
		sign = -1
	}
	exp := int(h>>10) & 0x1f
	man := float64(h & 0x3ff)
	switch exp {
	case 0:
		return sign * math.Ldexp(man, -24)
	case 31:
		if man != 0 {
			return math.NaN()
		}
		return sign * math.Inf(1)
	}
	return sign * math.Ldexp(1024+man, exp-25)
}

// floatAt reads element i of a float buffer.
func floatAt(t dtype.DType, b []byte, i int) float64 {
	switch t {
	case dtype.Float16:
		return halfToFloat(le.Uint16(b[2*i:]))
	case dtype.BFloat16:
		return float64(math.Float32frombits(uint32(le.Uint16(b[2*i:])) << 16))
	case dtype.Float32:
		return float64(math.Float32frombits(le.Uint32(b[4*i:])))
	case dtype.Float64:
		return math.Float64frombits(le.Uint64(b[8*i:]))
	}
	panic("not a float type")
}

// intAt reads element i of an integer buffer, widened.
func intAt(t dtype.DType, b []byte, i int) int64 {
	switch t {
	case dtype.Uint8:
		return int64(b[i])
	case dtype.Int8:
		return int64(int8(b[i]))
	case dtype.Int16:
		return int64(int16(le.Uint16(b[2*i:])))
	case dtype.Int32:
		return int64(int32(le.Uint32(b[4*i:])))
	case dtype.Int64:
		return int64(le.Uint64(b[8*i:]))
	}
	panic("not an integer type")
}

// wrap truncates v to t's width, as the typed arithmetic of the kernels does.
func wrap(t dtype.DType, v int64) int64 {
	switch t {
	case dtype.Uint8:
		return int64(uint8(v))
	case dtype.Int8:
		return int64(int8(v))
	case dtype.Int16:
		return int64(int16(v))
	case dtype.Int32:
		return int64(int32(v))
	}
	return v
}

// unitRoundoff is half an ulp at 1.0 in t.
func unitRoundoff(t dtype.DType) float64 {
	switch t {
	case dtype.Float16:
		return math.Ldexp(1, -11)
	case dtype.BFloat16:
		return math.Ldexp(1, -8)
	case dtype.Float32:
		return math.Ldexp(1, -24)
	}
	return math.Ldexp(1, -53)
}

// randomBytes returns n random bytes.
func randomBytes(rng *rand.Rand, n int) []byte {
	b := make([]byte, n+8)
	for i := 0; i < n; i += 8 {
		le.PutUint64(b[i:], rng.Uint64())
	}
	return b[:n:n]
}

// genInput makes nelems random elements of t suited to op: floats are kept in ranges where sums
// and products of up to 8 ranks neither overflow nor underflow, and are never zero (so that min/max
// of signed zeros, whose order is the kernels' business, do not arise); integers are any bits.
func genInput(rng *rand.Rand, t dtype.DType, op reduce.Op, nelems int) []byte {
	b := make([]byte, nelems*t.Size())
	lo, hi := 0.125, 2.0 // magnitudes
	if op == reduce.Prod {
		lo, hi = 0.5, 2.0
	}
	for i := range nelems {
		v := lo + rng.Float64()*(hi-lo)
		if rng.IntN(2) == 0 {
			v = -v
		}
		switch t {
		case dtype.Float16:
			// Pick exponent and mantissa bits directly; magnitudes [0.125, 2) or [0.5, 2).
			e := uint16(12 + rng.IntN(4))
			if op == reduce.Prod {
				e = uint16(14 + rng.IntN(2))
			}
			h := e<<10 | uint16(rng.IntN(1024))
			if rng.IntN(2) == 0 {
				h |= 0x8000
			}
			le.PutUint16(b[2*i:], h)
		case dtype.BFloat16:
			le.PutUint16(b[2*i:], uint16(math.Float32bits(float32(v))>>16))
		case dtype.Float32:
			le.PutUint32(b[4*i:], math.Float32bits(float32(v)))
		case dtype.Float64:
			le.PutUint64(b[8*i:], math.Float64bits(v))
		default:
			return randomBytes(rng, len(b)) // integers: any bits
		}
	}
	return b
}

// inputPeriod is the element count after which large inputs repeat: generating and checking
// several MiB element by element under the race detector would dominate the package's test time.
// 65537 is prime, so chunk and segment boundaries fall at different phases of the pattern.
const inputPeriod = 65537

// genTiled is genInput for large buffers: inputPeriod random elements, repeated.
func genTiled(rng *rand.Rand, t dtype.DType, op reduce.Op, nelems int) []byte {
	if nelems <= inputPeriod {
		return genInput(rng, t, op, nelems)
	}
	b := make([]byte, nelems*t.Size())
	pattern := genInput(rng, t, op, inputPeriod)
	for off := 0; off < len(b); off += len(pattern) {
		copy(b[off:], pattern)
	}
	return b
}

// checkReduced compares got with the reduction of inputs, exactly for integers and min/max, and
// within the error bound of n-1 roundings for float sums and products (whose order differs
// between algorithms). It describes the first mismatch, or returns "".
func checkReduced(t dtype.DType, op reduce.Op, got []byte, inputs [][]byte) string {
	return checkReducedPeriodic(t, op, got, inputs, len(got)/t.Size())
}

// checkTiled is checkReduced for inputs made by genTiled: the reference is computed for one
// period only.
func checkTiled(t dtype.DType, op reduce.Op, got []byte, inputs [][]byte) string {
	return checkReducedPeriodic(t, op, got, inputs, inputPeriod)
}

func checkReducedPeriodic(t dtype.DType, op reduce.Op, got []byte, inputs [][]byte, period int) string {
	es := t.Size()
	if len(got) != len(inputs[0]) {
		return fmt.Sprintf("result has %d bytes, want %d", len(got), len(inputs[0]))
	}
	nel := len(got) / es
	n := len(inputs)
	if nel == 0 {
		return ""
	}
	period = min(nel, period)
	if !t.IsFloat() {
		want := make([]int64, period)
		for i := range want {
			w := intAt(t, inputs[0], i)
			for _, in := range inputs[1:] {
				x := intAt(t, in, i)
				switch op {
				case reduce.Sum:
					w = wrap(t, w+x)
				case reduce.Prod:
					w = wrap(t, w*x)
				case reduce.Min:
					w = min(w, x)
				case reduce.Max:
					w = max(w, x)
				}
			}
			want[i] = w
		}
		for i := range nel {
			if g := intAt(t, got, i); g != want[i%period] {
				return fmt.Sprintf("element %d of %d: got %d, want %d", i, nel, g, want[i%period])
			}
		}
		return ""
	}
	want, tol := make([]float64, period), make([]float64, period)
	for i := range want {
		w := floatAt(t, inputs[0], i)
		mag := math.Abs(w)
		for _, in := range inputs[1:] {
			x := floatAt(t, in, i)
			switch op {
			case reduce.Sum:
				w += x
				mag += math.Abs(x)
			case reduce.Prod:
				w *= x
			case reduce.Min:
				w = min(w, x)
			case reduce.Max:
				w = max(w, x)
			}
		}
		want[i] = w
		switch op {
		case reduce.Sum:
			tol[i] = 2 * float64(n+1) * unitRoundoff(t) * mag
		case reduce.Prod:
			tol[i] = 2 * float64(n+1) * unitRoundoff(t) * math.Abs(w)
		}
	}
	for i := range nel {
		g, w, d := floatAt(t, got, i), want[i%period], tol[i%period]
		if math.Abs(g-w) > d || math.IsNaN(g) {
			return fmt.Sprintf("element %d of %d: got %g, want %g (tolerance %g)", i, nel, g, w, d)
		}
	}
	return ""
}
