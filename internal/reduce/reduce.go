// Package reduce holds the typed reduction kernels every collective runs on its hot path: dst = dst op
// src (Into), dst = op over n streams in one pass (Many, what the shared-memory allreduce calls), in-place
// scaling (Scale, for average/prescale/postscale) and the float16/bfloat16 conversions used by fp16
// compression.
//
// On amd64 the work is done by generated Go assembly (AVX2 or AVX-512, picked at start-up from CPUID and
// the OS's saved-state mask); everywhere else, with the purego build tag, or with
// KOLO_REDUCE_KERNEL=generic, by portable Go that gives identical results. Kernel reports which.
//
// Buffers are raw bytes of one element type in native byte order, sized and aliased as each function
// says; violations are programming errors and panic with what was wrong. The package must not allocate
// on the hot path (except Many with more than maxStackSrcs sources), block, log, or know anything about
// ranks, transports or tensors' owners.
//
// Semantics, chosen to match PyTorch:
//   - integer sum and prod wrap around (two's complement); uint8 is unsigned, int8/int16 signed.
//   - float min/max propagate NaN: if either input is NaN the result is NaN (torch.minimum/maximum).
//     Otherwise min(a, b) is (a < b ? a : b) and max is (a > b ? a : b), so min(-0, +0) is +0 (the
//     later operand) and max(+0, -0) is -0; torch leaves signed-zero order unspecified.
//   - float16/bfloat16 are computed in float32 and rounded once to nearest-even. For Into that is
//     exactly the correctly rounded half result; Many keeps the whole n-way reduction in float32.
package reduce

//go:generate go run ./internal/gen

import (
	"fmt"
	"os"
	"strings"
	"unsafe"

	"github.com/kolo-dl/kolo/internal/dtype"
	"github.com/kolo-dl/kolo/internal/settings"
)

// Op is a reduction operator.
type Op uint8

// The numeric values are part of the wire format and the C ABI: append only.
const (
	Sum Op = iota + 1
	Min
	Max
	Prod
)

const (
	numOps    = int(Prod) + 1
	numDTypes = int(dtype.Int16) + 1 // the last DType, not Float64: dtype appends new types
)

var opNames = [...]string{Sum: "sum", Min: "min", Max: "max", Prod: "prod"}

func (o Op) String() string {
	if o.Valid() {
		return opNames[o]
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// Valid reports whether o is one of the named operators.
func (o Op) Valid() bool { return o >= Sum && o <= Prod }

// ParseOp accepts the names String returns (any case) and "product".
func ParseOp(s string) (Op, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "sum":
		return Sum, nil
	case "min":
		return Min, nil
	case "max":
		return Max, nil
	case "prod", "product":
		return Prod, nil
	}
	return 0, fmt.Errorf("unknown reduce op %q (want sum, min, max or prod)", s)
}

// Into computes dst[i] = dst[i] op src[i] for every element. dst and src hold elements of type t, have
// the same length, a multiple of t.Size(); dst may be src but must not partly overlap it.
func Into(t dtype.DType, op Op, dst, src []byte) {
	checkTypeOp("Into", t, op)
	checkLen("Into", t, -1, len(dst), len(src))
	if partialOverlap(dst, src) {
		panic("reduce.Into: dst and src partly overlap")
	}
	if len(dst) == 0 {
		return
	}
	if k := active; k != nil {
		bulk := len(dst) &^ (k.unit - 1)
		for off := 0; off < bulk; off += chunkBytes {
			n := min(chunkBytes, bulk-off)
			intoAsm(k.isa, t, op, unsafe.Pointer(&dst[off]), unsafe.Pointer(&src[off]), n)
		}
		dst, src = dst[bulk:], src[bulk:]
	}
	intoGeneric(t, op, dst, src)
}

// maxStackSrcs is how many sources Many handles without allocating: more than any host has ranks.
const maxStackSrcs = 64

// Many computes dst[i] = srcs[0][i] op srcs[1][i] op ... for every element, in that order, reading each
// source once. len(srcs) >= 1 and every source has len(dst). dst may be any of the sources exactly (same
// start and length) but must not partly overlap one. Sources may overlap each other.
// Halves are accumulated in float32 and rounded once, so an n-way sum of halves is as exact as float32.
func Many(t dtype.DType, op Op, dst []byte, srcs ...[]byte) {
	checkTypeOp("Many", t, op)
	if len(srcs) == 0 {
		panic("reduce.Many: no sources")
	}
	for k, s := range srcs {
		checkLen("Many", t, k, len(dst), len(s))
		if partialOverlap(dst, s) {
			panic(fmt.Sprintf("reduce.Many: dst partly overlaps srcs[%d]", k))
		}
	}
	if len(dst) == 0 {
		return
	}
	if len(srcs) == 1 {
		copy(dst, srcs[0])
		return
	}
	if k := active; k != nil {
		bulk := len(dst) &^ (k.unit - 1)
		if bulk > 0 {
			var stack [maxStackSrcs]unsafe.Pointer
			ptrs := stack[:]
			if len(srcs) > maxStackSrcs {
				ptrs = make([]unsafe.Pointer, len(srcs))
			}
			ptrs = ptrs[:len(srcs)]
			for off := 0; off < bulk; off += chunkBytes {
				n := min(chunkBytes, bulk-off)
				for i, s := range srcs {
					ptrs[i] = unsafe.Pointer(&s[off])
				}
				manyAsm(k.isa, t, op, unsafe.Pointer(&dst[off]), &ptrs[0], len(ptrs), n)
			}
		}
		manyGeneric(t, op, dst, srcs, bulk)
		return
	}
	manyGeneric(t, op, dst, srcs, 0)
}

// Scale multiplies every element of buf by f in place.
//
// Floats multiply in their own precision: float32 and halves by float32(f) (halves widened to float32
// and rounded once), float64 by f.
//
// Integers: if f is an integer the product is exact and wraps like torch's integer mul; if 1/f is an
// integer n (average over n ranks: f = 1.0/n) the result is x / n truncated toward zero, exactly, which
// is torch.div(x, n, rounding_mode="trunc") and what Horovod's C++ double-to-int cast intends (multiplying
// by an inexact 1/n would turn 49/49 into 0). Any other f multiplies in float64 and truncates toward zero,
// saturating at the type's range (NaN gives 0).
func Scale(t dtype.DType, buf []byte, f float64) {
	checkType("Scale", t)
	if len(buf)%t.Size() != 0 {
		panic(fmt.Sprintf("reduce.Scale: buf is %d bytes, not a multiple of %v's %d", len(buf), t, t.Size()))
	}
	if len(buf) == 0 {
		return
	}
	if k := active; k != nil && t.IsFloat() {
		bulk := len(buf) &^ (k.unit - 1)
		for off := 0; off < bulk; off += chunkBytes {
			n := min(chunkBytes, bulk-off)
			scaleAsm(k.isa, t, unsafe.Pointer(&buf[off]), n, f)
		}
		buf = buf[bulk:]
	}
	scaleGeneric(t, buf, f)
}

// Kernel names the active implementation: "avx512", "avx2" or "generic".
func Kernel() string {
	if active == nil {
		return "generic"
	}
	return active.name
}

// KernelEnv names the environment variable that forces a kernel ("generic", "avx2", "avx512"); a
// kernel the CPU cannot run is ignored and the best available one is used (settings.ReduceKernel).
var KernelEnv = settings.ReduceKernel.Name

// chunkBytes bounds one assembly call: kernels are not preemptible, so a 64 MiB reduction is split into
// calls of ~10 µs to keep GC stop-the-world pauses short.
const chunkBytes = 256 << 10

// isaID names an accelerated instruction set; the generated intoAsm, manyAsm, scaleAsm and cvtAsm
// switch on it (direct calls, so pointer arguments stay on the stack).
type isaID uint8

type cvtKind uint8

const (
	cvtF16ToF32 cvtKind = iota
	cvtF32ToF16
	cvtBF16ToF32
	cvtF32ToBF16
)

// kernelSet is one accelerated implementation. Its kernels take byte counts of the narrow type that
// are multiples of unit; the Go side does the remainder with the generic code.
type kernelSet struct {
	name string
	isa  isaID
	unit int
}

// usable is what available reports for this CPU, asked once: CPUID traps to the hypervisor in a VM.
var usable = available()

// active is the kernel set in use; nil means generic Go. Set once at init (tests switch it between
// cases, never concurrently with calls).
var active = pick(kernelFromEnv())

// kernelFromEnv is the kernel the environment forces, if any.
func kernelFromEnv() string {
	_, v := settings.ReduceKernel.Lookup(os.Getenv)
	return v
}

// pick returns the named usable kernel set, or the best usable one if name is empty or unusable.
func pick(name string) *kernelSet {
	sets := usable
	if name == "generic" {
		return nil
	}
	for _, k := range sets {
		if k.name == name {
			return k
		}
	}
	if len(sets) == 0 {
		return nil
	}
	return sets[0]
}

// Kernels lists the kernels this CPU can run, best first, always ending with "generic".
func Kernels() []string {
	var names []string
	for _, k := range usable {
		names = append(names, k.name)
	}
	return append(names, "generic")
}

func checkType(fn string, t dtype.DType) {
	if !t.Valid() {
		panic(fmt.Sprintf("reduce.%s: invalid dtype %v", fn, t))
	}
}

func checkTypeOp(fn string, t dtype.DType, op Op) {
	checkType(fn, t)
	if !op.Valid() {
		panic(fmt.Sprintf("reduce.%s: invalid op %v", fn, op))
	}
}

// checkLen checks src (srcs[k] for k >= 0) against dst; it formats only when it panics, so that the hot
// path does not allocate.
func checkLen(fn string, t dtype.DType, k, dstLen, srcLen int) {
	if dstLen != srcLen {
		what := "src"
		if k >= 0 {
			what = fmt.Sprintf("srcs[%d]", k)
		}
		panic(fmt.Sprintf("reduce.%s: dst is %d bytes but %s is %d", fn, dstLen, what, srcLen))
	}
	if dstLen%t.Size() != 0 {
		panic(fmt.Sprintf("reduce.%s: %d bytes is not a multiple of %v's %d", fn, dstLen, t, t.Size()))
	}
}

// partialOverlap reports whether a and b share memory without starting at the same address.
func partialOverlap(a, b []byte) bool {
	if len(a) == 0 || len(b) == 0 {
		return false
	}
	pa, pb := uintptr(unsafe.Pointer(&a[0])), uintptr(unsafe.Pointer(&b[0]))
	return pa != pb && pa < pb+uintptr(len(b)) && pb < pa+uintptr(len(a))
}
