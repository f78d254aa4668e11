package reduce

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"

	"github.com/kolo-dl/kolo/internal/dtype"
)

var ops = []Op{Sum, Min, Max, Prod}

// elemCounts are the awkward sizes: around every vector width and unroll boundary, primes, and a few MiB.
func elemCounts(t dtype.DType) []int {
	n := []int{0, 1, 2, 3, 7, 15, 16, 17, 31, 33, 63, 64, 65, 127, 1000, 4097}
	big := 3<<20 + 5*64 + 3 // > chunkBytes, odd
	switch {
	case raceEnabled: // kernels are single-goroutine: the race detector only slows the reference
		big = 70<<10 + 3
	case testing.Short():
		big = 300<<10 + 3
	}
	return append(n, big/t.Size())
}

// eachKernel runs f once per kernel this machine can run (generic always), with that kernel active.
func eachKernel(t *testing.T, f func(t *testing.T)) {
	t.Helper()
	for _, name := range Kernels() {
		t.Run(name, func(t *testing.T) {
			defer func(k *kernelSet) { active = k }(active)
			active = pick(name)
			if Kernel() != name {
				t.Fatalf("asked for kernel %q, got %q", name, Kernel())
			}
			f(t)
		})
	}
}

func TestKernels(t *testing.T) {
	ks := Kernels()
	if ks[len(ks)-1] != "generic" {
		t.Fatalf("Kernels() = %v, want generic last", ks)
	}
	if runtime.GOARCH == "amd64" && len(ks) == 1 {
		t.Logf("amd64 without AVX2 (or purego build): only the generic kernel is tested")
	}
	t.Logf("kernels: %v, active: %s", ks, Kernel())
}

// buffers returns n-element buffers of t at byte offset off into fresh memory, so kernels see unaligned
// pointers too.
func buffer(rng *rand.Rand, t dtype.DType, n, off int) []byte {
	b := make([]byte, n*t.Size()+off)[off:]
	fill(rng, t, b)
	return b
}

// offsets: amd64 is the only place the assembly runs, and it does not care about alignment; elsewhere
// keep element alignment.
func offsets() []int {
	if runtime.GOARCH == "amd64" {
		return []int{0, 1}
	}
	return []int{0}
}

// withKernel runs f with kernel name active.
func withKernel(name string, f func()) {
	defer func(k *kernelSet) { active = k }(active)
	active = pick(name)
	f()
}

// TestInto and TestMany build each case's inputs and reference once and run every kernel on copies.
func TestInto(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, typ := range dtype.All {
		for _, op := range ops {
			for _, n := range elemCounts(typ) {
				for _, off := range append(offsets(), -1) { // -1: dst is src
					dst0, src := buffer(rng, typ, n, max(off, 0)), buffer(rng, typ, n, 0)
					if off < 0 {
						src = dst0
					}
					want := refMany(typ, op, [][]byte{dst0, src})
					srcCopy := append([]byte(nil), src...)
					for _, k := range Kernels() {
						name := fmt.Sprintf("%s: %v/%v/n=%d/off=%d", k, typ, op, n, off)
						dst, s := cloneAt(dst0, max(off, 0)), src
						if off < 0 {
							s = dst
						}
						withKernel(k, func() { Into(typ, op, dst, s) })
						sameElems(t, typ, name, dst, want)
						if off >= 0 && string(src) != string(srcCopy) {
							t.Fatalf("%s: src modified", name)
						}
					}
				}
			}
		}
	}
}

// cloneAt copies b to byte offset off of fresh memory.
func cloneAt(b []byte, off int) []byte {
	c := make([]byte, off+len(b))[off:]
	copy(c, b)
	return c
}

func TestMany(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, typ := range dtype.All {
		for _, op := range ops {
			for _, n := range elemCounts(typ) {
				nsrcs := []int{1, 2, 3, 4, 5, 6, 7, 8, 9}
				if n >= 1000 {
					nsrcs = []int{2, 3, 8}
				}
				if n*typ.Size() > 1<<18 { // the big size is for chunking; one odd count will do
					nsrcs = []int{5}
				}
				for _, nsrc := range nsrcs {
					srcs := make([][]byte, nsrc)
					for k := range srcs {
						srcs[k] = buffer(rng, typ, n, k%2)
					}
					want := refMany(typ, op, srcs)
					for _, kern := range Kernels() {
						name := fmt.Sprintf("%s: %v/%v/n=%d/srcs=%d", kern, typ, op, n, nsrc)
						dst := make([]byte, n*typ.Size())
						withKernel(kern, func() { Many(typ, op, dst, srcs...) })
						sameElems(t, typ, name, dst, want)

						// dst is one of the sources, exactly (what the shm allreduce does with its own slice).
						cp := make([][]byte, nsrc)
						for k := range cp {
							cp[k] = append([]byte(nil), srcs[k]...)
						}
						k := rng.IntN(nsrc)
						withKernel(kern, func() { Many(typ, op, cp[k], cp...) })
						sameElems(t, typ, name+fmt.Sprintf("/dst=srcs[%d]", k), cp[k], want)
					}
				}
			}
		}
	}
}

// TestManyRepeatedSource: the same buffer may appear several times, and as dst.
func TestManyRepeatedSource(t *testing.T) {
	eachKernel(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(5, 6))
		for _, typ := range dtype.All {
			a, b := buffer(rng, typ, 1001, 0), buffer(rng, typ, 1001, 0)
			srcs := [][]byte{a, b, a, a, b}
			want := refMany(typ, Sum, srcs)
			Many(typ, Sum, a, srcs...)
			sameElems(t, typ, typ.String(), a, want)
		}
	})
}

// TestManyHalfAccumulatesInFloat32: 8 ranks each adding 1 to 2048 is exact with one rounding at the
// end (2056 is a float16), but 2048+1 rounds back to 2048 at every step if rounded pairwise.
func TestManyHalfAccumulatesInFloat32(t *testing.T) {
	eachKernel(t, func(t *testing.T) {
		const n = 100
		srcs := make([][]byte, 9)
		for k := range srcs {
			srcs[k] = make([]byte, 2*n)
			v := float32(1)
			if k == 0 {
				v = 2048
			}
			for i := 0; i < n; i++ {
				ne.PutUint16(srcs[k][2*i:], Float32ToFloat16Bits(v))
			}
		}
		dst := make([]byte, 2*n)
		Many(dtype.Float16, Sum, dst, srcs...)
		for i := 0; i < n; i++ {
			if got := Float16BitsToFloat32(ne.Uint16(dst[2*i:])); got != 2056 {
				t.Fatalf("element %d: got %v, want 2056", i, got)
			}
		}
	})
}

func TestNaNPropagates(t *testing.T) {
	nan, one := math.NaN(), 1.0
	eachKernel(t, func(t *testing.T) {
		for _, typ := range []dtype.DType{dtype.Float16, dtype.BFloat16, dtype.Float32, dtype.Float64} {
			for _, op := range []Op{Min, Max} {
				for _, c := range [][2]float64{{nan, one}, {one, nan}, {nan, nan}, {math.Inf(1), nan}} {
					const n = 67 // vectors and a tail
					dst, src := encode(typ, c[0], n), encode(typ, c[1], n)
					Into(typ, op, dst, src)
					for i := 0; i < n; i++ {
						if !isNaN(typ, dst[i*typ.Size():]) {
							t.Fatalf("%v %v(%v, %v)[%d]: got %x, want NaN", typ, op, c[0], c[1], i, dst[i*typ.Size():(i+1)*typ.Size()])
						}
					}
				}
			}
		}
	})
}

func encode(t dtype.DType, v float64, n int) []byte {
	b := make([]byte, n*t.Size())
	for i := 0; i < n; i++ {
		e := b[i*t.Size():]
		switch t {
		case dtype.Float16:
			ne.PutUint16(e, refToF16(v))
		case dtype.BFloat16:
			ne.PutUint16(e, refToBF16(v))
		case dtype.Float32:
			ne.PutUint32(e, math.Float32bits(float32(v)))
		case dtype.Float64:
			ne.PutUint64(e, math.Float64bits(v))
		}
	}
	return b
}

func TestScaleFloat(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for _, typ := range []dtype.DType{dtype.Float16, dtype.BFloat16, dtype.Float32, dtype.Float64} {
		for _, f := range []float64{1.0 / 3, -7.5, 0, 1e30} {
			for _, n := range elemCounts(typ) {
				buf := buffer(rng, typ, n, n%2)
				want := make([]byte, len(buf))
				for i := 0; i < len(buf); i += typ.Size() {
					e := buf[i:]
					switch typ {
					case dtype.Float16:
						ne.PutUint16(want[i:], refToF16(float64(float32(refF16ToF32(ne.Uint16(e)))*float32(f))))
					case dtype.BFloat16:
						ne.PutUint16(want[i:], refToBF16(float64(float32(refBF16ToF32(ne.Uint16(e)))*float32(f))))
					case dtype.Float32:
						ne.PutUint32(want[i:], math.Float32bits(math.Float32frombits(ne.Uint32(e))*float32(f)))
					case dtype.Float64:
						ne.PutUint64(want[i:], math.Float64bits(math.Float64frombits(ne.Uint64(e))*f))
					}
				}
				for _, k := range Kernels() {
					got := cloneAt(buf, n%2)
					withKernel(k, func() { Scale(typ, got, f) })
					sameElems(t, typ, fmt.Sprintf("%s: %v*%v/n=%d", k, typ, f, n), got, want)
				}
			}
		}
	}
}

func TestScaleInt(t *testing.T) {
	cases := []struct {
		typ  dtype.DType
		x    int64
		f    float64
		want int64
	}{
		{dtype.Int32, 49, 1.0 / 49, 1}, // 49 * fl(1/49) < 1: must not truncate to 0
		{dtype.Int32, 48, 1.0 / 49, 0},
		{dtype.Int32, -7, 0.5, -3}, // truncation toward zero, not floor
		{dtype.Int32, 7, 1.0 / 3, 2},
		{dtype.Int32, -7, 1.0 / 3, -2},
		{dtype.Int64, 1<<62 + 1, 0.5, 1 << 61}, // exact division, no float64 rounding
		{dtype.Int64, 1<<62 + 3, 1.0 / 8, (1<<62 + 3) / 8},
		{dtype.Int64, math.MaxInt64, 1, math.MaxInt64},
		{dtype.Int64, math.MinInt64, -1, math.MinInt64}, // integer multiply wraps
		{dtype.Int32, math.MaxInt32, 2, -2},             // wraps
		{dtype.Int32, 3, 2.5, 7},
		{dtype.Int8, 100, 2.5, 127}, // non-integer factor saturates
		{dtype.Int8, -100, 2.5, -128},
		{dtype.Int16, 30000, 2.5, math.MaxInt16},
		{dtype.Int16, -30000, 2.5, math.MinInt16},
		{dtype.Int16, 20000, 2, -25536},                 // 40000 wraps
		{dtype.Int16, math.MinInt16, -1, math.MinInt16}, // -(-32768) wraps
		{dtype.Int16, 49, 1.0 / 49, 1},
		{dtype.Int16, -7, 0.5, -3},
		{dtype.Int16, -7, 1.0 / 3, -2},
		{dtype.Int16, 1000, 1.0 / 8, 125},
		{dtype.Int16, 5, math.NaN(), 0},
		{dtype.Int16, -5, math.Inf(1), math.MinInt16},
		{dtype.Uint8, 200, -0.5, 0},
		{dtype.Uint8, 200, 1.0 / -2, 0},
		{dtype.Uint8, 200, 1.0 / 8, 25},
		{dtype.Uint8, 200, 2, 144}, // 400 mod 256
		{dtype.Int64, 5, math.NaN(), 0},
		{dtype.Int64, 5, math.Inf(1), math.MaxInt64},
		{dtype.Int64, 1 << 40, 1e10 + 0.5, math.MaxInt64},
		{dtype.Int64, 1 << 40, 1 << 30, 0}, // integral factor wraps: 2^70 mod 2^64
		{dtype.Int32, 5, 0, 0},
	}
	eachKernel(t, func(t *testing.T) {
		for _, c := range cases {
			const n = 70
			buf := make([]byte, n*c.typ.Size())
			for i := 0; i < n; i++ {
				putInt(c.typ, buf[i*c.typ.Size():], c.x)
			}
			Scale(c.typ, buf, c.f)
			for i := 0; i < n; i++ {
				if got := getInt(c.typ, buf[i*c.typ.Size():]); got != c.want {
					t.Fatalf("Scale(%v %d, %v)[%d] = %d, want %d", c.typ, c.x, c.f, i, got, c.want)
				}
			}
		}
	})
}

func putInt(t dtype.DType, b []byte, v int64) {
	switch t {
	case dtype.Uint8, dtype.Int8:
		b[0] = byte(v)
	case dtype.Int16:
		ne.PutUint16(b, uint16(v))
	case dtype.Int32:
		ne.PutUint32(b, uint32(v))
	case dtype.Int64:
		ne.PutUint64(b, uint64(v))
	}
}

func getInt(t dtype.DType, b []byte) int64 {
	switch t {
	case dtype.Uint8:
		return int64(b[0])
	case dtype.Int8:
		return int64(int8(b[0]))
	case dtype.Int16:
		return int64(int16(ne.Uint16(b)))
	case dtype.Int32:
		return int64(int32(ne.Uint32(b)))
	}
	return int64(ne.Uint64(b))
}

func TestOp(t *testing.T) {
	for _, op := range ops {
		got, err := ParseOp(strings.ToUpper(op.String()))
		if err != nil || got != op {
			t.Errorf("ParseOp(%q) = %v, %v", op.String(), got, err)
		}
	}
	if Sum != 1 || Min != 2 || Max != 3 || Prod != 4 {
		t.Fatal("Op values are wire format and must not change")
	}
	if _, err := ParseOp("average"); err == nil {
		t.Error("ParseOp(average) succeeded; average is sum then Scale")
	}
	if s := Op(9).String(); s != "op(9)" {
		t.Errorf("Op(9).String() = %q", s)
	}
}

func TestPanics(t *testing.T) {
	b8, b7 := make([]byte, 8), make([]byte, 7)
	cases := map[string]func(){
		"length mismatch":   func() { Into(dtype.Float32, Sum, b8, make([]byte, 12)) },
		"not a multiple":    func() { Into(dtype.Float32, Sum, b7, make([]byte, 7)) },
		"partial overlap":   func() { Into(dtype.Uint8, Sum, b8[:4], b8[2:6]) },
		"invalid dtype":     func() { Into(dtype.Invalid, Sum, b8, b8) },
		"invalid op":        func() { Into(dtype.Int32, Op(0), b8, b8) },
		"many no sources":   func() { Many(dtype.Int32, Sum, b8) },
		"many length":       func() { Many(dtype.Int32, Sum, b8, b8, make([]byte, 4)) },
		"many overlap":      func() { Many(dtype.Uint8, Sum, b8[:4], b8[1:5], b8[1:5]) },
		"scale not mult":    func() { Scale(dtype.Int64, b7, 2) },
		"scale invalid":     func() { Scale(dtype.DType(99), b8, 2) },
		"convert length":    func() { Float32ToFloat16(b7, make([]float32, 4)) },
		"convert length bf": func() { BFloat16ToFloat32(make([]float32, 3), b8) },
	}
	for name, f := range cases {
		t.Run(name, func(t *testing.T) {
			defer func() {
				r := recover()
				if r == nil {
					t.Fatal("did not panic")
				}
				if s, ok := r.(string); !ok || !strings.HasPrefix(s, "reduce.") {
					t.Fatalf("panic %v does not say which function", r)
				}
			}()
			f()
		})
	}
}

// TestConvertExhaustive widens all 65536 halves (through the slice functions, so the vector path
// sees every pattern) and checks they narrow back to themselves.
func TestConvertExhaustive(t *testing.T) {
	eachKernel(t, func(t *testing.T) {
		for _, bf := range []bool{false, true} {
			halves := make([]byte, 2<<16)
			for i := 0; i < 1<<16; i++ {
				ne.PutUint16(halves[2*i:], uint16(i))
			}
			floats := make([]float32, 1<<16)
			back := make([]byte, len(halves))
			ref, name := refF16ToF32, "float16"
			if bf {
				ref, name = refBF16ToF32, "bfloat16"
				BFloat16ToFloat32(floats, halves)
				Float32ToBFloat16(back, floats)
			} else {
				Float16ToFloat32(floats, halves)
				Float32ToFloat16(back, floats)
			}
			typ := map[bool]dtype.DType{false: dtype.Float16, true: dtype.BFloat16}[bf]
			for i := 0; i < 1<<16; i++ {
				want := ref(uint16(i))
				got := float64(floats[i])
				if math.IsNaN(got) && math.IsNaN(want) {
					continue
				}
				if got != want || math.Signbit(got) != math.Signbit(want) {
					t.Fatalf("%s %#04x widened to %v, want %v", name, i, got, want)
				}
			}
			sameElems(t, typ, name+" round trip", back, halves)
		}
	})
}

// TestNarrowRounding checks float32 -> half at and around every rounding boundary (the midpoint of each
// pair of neighbouring halves, one float32 ulp either side), plus random float32s.
func TestNarrowRounding(t *testing.T) {
	var in []float32
	for _, p := range []struct {
		widen func(uint16) float64
		limit uint16
	}{{refF16ToF32, 0x7c00}, {refBF16ToF32, 0x7f80}} {
		for h := uint16(0); h < p.limit; h++ {
			lo, hi := p.widen(h), p.widen(h+1) // hi may be +Inf: midpoint is then the overflow threshold
			mid := float32(lo + (hi-lo)/2)
			if math.IsInf(hi, 1) {
				mid = float32(lo + (lo-p.widen(h-1))/2)
			}
			for _, m := range []float32{mid, math.Nextafter32(mid, 0), math.Nextafter32(mid, float32(math.Inf(1)))} {
				in = append(in, m, -m)
			}
		}
	}
	rng := rand.New(rand.NewPCG(9, 10))
	for i := 0; i < 1<<16; i++ {
		in = append(in, math.Float32frombits(rng.Uint32()))
	}
	want16, want16b := make([]byte, 2*len(in)), make([]byte, 2*len(in))
	for i, f := range in {
		ne.PutUint16(want16[2*i:], refToF16(float64(f)))
		ne.PutUint16(want16b[2*i:], refToBF16(float64(f)))
	}
	eachKernel(t, func(t *testing.T) {
		got16, got16b := make([]byte, 2*len(in)), make([]byte, 2*len(in))
		Float32ToFloat16(got16, in)
		Float32ToBFloat16(got16b, in)
		sameElems(t, dtype.Float16, "f32->f16", got16, want16)
		sameElems(t, dtype.BFloat16, "f32->bf16", got16b, want16b)
	})
}

// TestHalfNaNStaysNaN: narrowing a NaN whose payload lives only in the low bits must not give Inf (a
// truncating conversion would), and bf16 rounding must not carry a NaN into the sign.
func TestHalfNaNStaysNaN(t *testing.T) {
	nans := []float32{math.Float32frombits(0x7f800001), math.Float32frombits(0xff800001),
		math.Float32frombits(0x7fffffff), math.Float32frombits(0xffffffff), float32(math.NaN())}
	eachKernel(t, func(t *testing.T) {
		in := make([]float32, 0, 64)
		for len(in) < 64 {
			in = append(in, nans...)
		}
		in = in[:64]
		f16, bf16 := make([]byte, 128), make([]byte, 128)
		Float32ToFloat16(f16, in)
		Float32ToBFloat16(bf16, in)
		for i, f := range in {
			for _, c := range []struct {
				typ dtype.DType
				b   []byte
			}{{dtype.Float16, f16}, {dtype.BFloat16, bf16}} {
				h := c.b[2*i : 2*i+2]
				if !isNaN(c.typ, h) || (ne.Uint16(h)>>15 == 1) != math.Signbit(float64(f)) {
					t.Fatalf("%v of NaN %#08x = %x: want a NaN of the same sign", c.typ, math.Float32bits(f), h)
				}
			}
		}
	})
}

// FuzzInto checks every kernel against the reference on arbitrary bytes.
func FuzzInto(f *testing.F) {
	f.Add(uint8(dtype.Float16), uint8(Sum), []byte("\x00\x7c\x01\x7c\xff\xff\x00\x80 0123456789abcdefghijklmnopqrstuvwxyz"))
	f.Add(uint8(dtype.Int64), uint8(Prod), make([]byte, 200))
	f.Add(uint8(dtype.Int16), uint8(Min), []byte("\x00\x80\xff\x7f\xff\xff\x01\x00 0123456789abcdefghijklmnopqrstuvwxyz0123456789"))
	f.Add(uint8(dtype.BFloat16), uint8(Max), []byte("\x80\x7f\xc1\xff\x01\x00\x7f\x7f 0123456789abcdefghijklmnopqrstuvwxyz0123456789"))
	f.Fuzz(func(t *testing.T, ti, oi uint8, data []byte) {
		typ, op := dtype.DType(int(ti-1)%(numDTypes-1)+1), Op(oi%4+1) // ti = 1..9 is that dtype
		n := len(data) / 2 / typ.Size() * typ.Size()
		want := refMany(typ, op, [][]byte{data[:n], data[n : 2*n]})
		for _, name := range Kernels() {
			prev := active
			active = pick(name)
			dst := append([]byte(nil), data[:n]...)
			Into(typ, op, dst, data[n:2*n])
			active = prev
			sameElems(t, typ, fmt.Sprintf("%s %v %v", name, typ, op), dst, want)
		}
	})
}

func TestPickUnknownFallsBack(t *testing.T) {
	if k := pick("no-such-kernel"); Kernels()[0] != "generic" && k == nil {
		t.Fatal("unknown kernel name should fall back to the best one")
	}
	if pick("generic") != nil {
		t.Fatal(`pick("generic") should select the portable path`)
	}
}

// TestNoAllocs: the hot path must not allocate (the engine calls these per fused buffer, per step).
func TestNoAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	eachKernel(t, func(t *testing.T) {
		const n = 4099 // vectors and a tail
		for _, typ := range dtype.All {
			dst, a, b := make([]byte, n*typ.Size()), make([]byte, n*typ.Size()), make([]byte, n*typ.Size())
			floats, halves := make([]float32, n), make([]byte, 2*n)
			allocs := testing.AllocsPerRun(10, func() {
				Into(typ, Sum, dst, a)
				Many(typ, Max, dst, a, b, dst, a, b, a, b)
				Scale(typ, dst, 0.5)
				Float32ToFloat16(halves, floats)
				BFloat16ToFloat32(floats, halves)
			})
			if allocs != 0 {
				t.Errorf("%v: %v allocations per call", typ, allocs)
			}
		}
	})
}

// TestManyMoreSourcesThanStack covers the heap-allocated pointer array (more ranks than maxStackSrcs).
func TestManyMoreSourcesThanStack(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for _, typ := range []dtype.DType{dtype.Float16, dtype.Int16, dtype.Int32} {
		srcs := make([][]byte, maxStackSrcs+3)
		for k := range srcs {
			srcs[k] = buffer(rng, typ, 301, 0)
		}
		want := refMany(typ, Sum, srcs)
		eachKernel(t, func(t *testing.T) {
			dst := make([]byte, len(want))
			Many(typ, Sum, dst, srcs...)
			sameElems(t, typ, typ.String(), dst, want)
		})
	}
}
