// Command gen writes reduce's amd64 kernels: kernels_amd64.s (Go assembly) and kernels_amd64.go (the
// declarations and the dispatch tables that point at them).
//
// Every dtype x op x {into, many} kernel, plus scale and the half conversions, comes from the same few
// emitters below, once for AVX2 (Y registers) and once for AVX-512 (Z registers), so a fix to, say, the
// bf16 rounding lands in all of them at once. It must not be imported: it is run by `go generate` in
// reduce/, and its test checks that the committed files are what it produces.
//
// Kernel contract (what reduce's Go side relies on): n is a byte count of the narrow element type and a
// multiple of the ISA's vector width (32 or 64 bytes); the kernel does exactly n bytes and nothing more.
// Unaligned pointers are fine. Kernels are leaves with no frame; the Go side chunks long buffers so that
// the goroutine stays preemptible between calls.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"go/format"
	"log"
	"os"
	"path/filepath"
)

func main() {
	out := flag.String("out", ".", "directory to write kernels_amd64.{s,go} into")
	flag.IntVar(&prefetch, "prefetch", prefetch, "software prefetch distance in bytes for into/many (0: none)")
	flag.Parse()
	s, g, err := Generate()
	if err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(*out, "kernels_amd64.s"), s, 0o644); err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(*out, "kernels_amd64.go"), g, 0o644); err != nil {
		log.Fatal(err)
	}
}

// prefetch is how far ahead into and many prefetch each input stream (0: rely on the hardware).
var prefetch = 0

// isa is one instruction-set flavour of the kernels.
type isa struct {
	name string // suffix of function names and kernelSet name
	vb   int    // vector bytes
	reg  string // register prefix
	evex bool   // AVX-512 encodings: opmask registers, VPANDD/VPORD, VMOVDQU64
}

var isas = []isa{
	{name: "AVX2", vb: 32, reg: "Y"},
	{name: "AVX512", vb: 64, reg: "Z", evex: true},
}

// elem is an element type as the kernels see it.
type elem struct {
	name string // function-name part
	dt   string // dtype constant
	kind string // u8 i8 i16 i32 i64 f32 f64 f16 bf16
}

var elems = []elem{
	{"U8", "Uint8", "u8"},
	{"I8", "Int8", "i8"},
	{"I16", "Int16", "i16"},
	{"I32", "Int32", "i32"},
	{"I64", "Int64", "i64"},
	{"F16", "Float16", "f16"},
	{"BF16", "BFloat16", "bf16"},
	{"F32", "Float32", "f32"},
	{"F64", "Float64", "f64"},
}

var ops = []string{"Sum", "Min", "Max", "Prod"}

func (e elem) half() bool { return e.kind == "f16" || e.kind == "bf16" }

// work is the kind the arithmetic happens in: halves are widened to f32.
func (e elem) work() string {
	if e.half() {
		return "f32"
	}
	return e.kind
}

// Register plan (16 vector registers suffice for both ISAs):
//
//	0-3   accumulators        4-7  loaded operands
//	8-10  temporaries         11   byte-product mask 0x00ff / scale factor
//	12-15 bf16 constants: 0xffff0000, 0x7fff, 1, 0x00400000 (f32 quiet bit)
const (
	rTmp0, rTmp1, rTmp2 = 8, 9, 10
	rLow                = 11
	rFactor             = 11
	rMaskHi             = 12
	rBias               = 13
	rOne                = 14
	rQuiet              = 15
)

type emitter struct {
	b   bytes.Buffer
	isa isa
}

func (w *emitter) ins(format string, args ...any) {
	fmt.Fprintf(&w.b, "\t"+format+"\n", args...)
}

func (w *emitter) label(l string) { fmt.Fprintf(&w.b, "%s:\n", l) }

func (w *emitter) r(i int) string { return fmt.Sprintf("%s%d", w.isa.reg, i) }

func (w *emitter) and() string {
	if w.isa.evex {
		return "VPANDD"
	}
	return "VPAND"
}

func (w *emitter) or() string {
	if w.isa.evex {
		return "VPORD"
	}
	return "VPOR"
}

func (w *emitter) mov() string {
	if w.isa.evex {
		return "VMOVDQU64"
	}
	return "VMOVDQU"
}

// mem formats base+AX*scale+off.
func mem(base string, off, scale int) string {
	return fmt.Sprintf("%d(%s)(AX*%d)", off, base, scale)
}

func (w *emitter) ones(r int) {
	if w.isa.evex {
		w.ins("VPTERNLOGD $0xff, %s, %s, %s", w.r(r), w.r(r), w.r(r))
	} else {
		w.ins("VPCMPEQD %s, %s, %s", w.r(r), w.r(r), w.r(r))
	}
}

// consts loads the constants e's loads, stores and op need (all derived from all-ones, so no DATA).
func (w *emitter) consts(e elem, op string) {
	if (e.kind == "u8" || e.kind == "i8") && op == "Prod" {
		w.ones(rLow)
		w.ins("VPSRLW $8, %s, %s", w.r(rLow), w.r(rLow))
	}
	if e.kind == "bf16" {
		w.bf16Consts()
	}
}

func (w *emitter) bf16Consts() {
	for _, r := range []int{rMaskHi, rBias, rOne, rQuiet} {
		w.ones(r)
	}
	w.ins("VPSLLD $16, %s, %s", w.r(rMaskHi), w.r(rMaskHi))
	w.ins("VPSRLD $17, %s, %s", w.r(rBias), w.r(rBias))
	w.ins("VPSRLD $31, %s, %s", w.r(rOne), w.r(rOne))
	w.ins("VPSRLD $31, %s, %s", w.r(rQuiet), w.r(rQuiet))
	w.ins("VPSLLD $22, %s, %s", w.r(rQuiet), w.r(rQuiet))
}

// vecs is how many working registers one vector of e's bytes widens to.
func vecs(e elem) int {
	if e.half() {
		return 2
	}
	return 1
}

// load fills regs[0:vecs(e)] from one vector's worth of e at base+AX+off. bf16 is split into even
// elements (low halves, shifted up) and odd elements (high halves, masked) so no lane shuffles are needed;
// store undoes the same split.
func (w *emitter) load(e elem, base string, off int, regs []int) {
	switch e.kind {
	case "f16":
		w.ins("VCVTPH2PS %s, %s", mem(base, off, 1), w.r(regs[0]))
		w.ins("VCVTPH2PS %s, %s", mem(base, off+w.isa.vb/2, 1), w.r(regs[1]))
	case "bf16":
		w.ins("%s %s, %s", w.mov(), mem(base, off, 1), w.r(regs[0]))
		w.ins("%s %s, %s, %s", w.and(), mem(base, off, 1), w.r(rMaskHi), w.r(regs[1]))
		w.ins("VPSLLD $16, %s, %s", w.r(regs[0]), w.r(regs[0]))
	default:
		w.ins("%s %s, %s", w.mov(), mem(base, off, 1), w.r(regs[0]))
	}
}

func (w *emitter) store(e elem, base string, off int, regs []int) {
	switch e.kind {
	case "f16":
		w.ins("VCVTPS2PH $0, %s, %s", w.r(regs[0]), mem(base, off, 1))
		w.ins("VCVTPS2PH $0, %s, %s", w.r(regs[1]), mem(base, off+w.isa.vb/2, 1))
	case "bf16":
		w.roundBF16(regs[0])
		w.roundBF16(regs[1])
		w.ins("VPSRLD $16, %s, %s", w.r(regs[0]), w.r(regs[0]))
		w.ins("%s %s, %s, %s", w.and(), w.r(rMaskHi), w.r(regs[1]), w.r(regs[1]))
		w.ins("%s %s, %s, %s", w.or(), w.r(regs[1]), w.r(regs[0]), w.r(regs[0]))
		w.ins("%s %s, %s", w.mov(), w.r(regs[0]), mem(base, off, 1))
	default:
		w.ins("%s %s, %s", w.mov(), w.r(regs[0]), mem(base, off, 1))
	}
}

// roundBF16 rounds the f32 in r to nearest-even at bit 16, leaving the bf16 in r's high half: r +=
// 0x7fff + ((r>>16)&1). That carry trick is wrong for NaN (it can carry into the sign), so NaN lanes
// instead get the quiet bit set and keep their sign and top payload bits.
func (w *emitter) roundBF16(r int) {
	t := rTmp0
	w.ins("VPSRLD $16, %s, %s", w.r(r), w.r(t))
	w.ins("%s %s, %s, %s", w.and(), w.r(rOne), w.r(t), w.r(t))
	w.ins("VPADDD %s, %s, %s", w.r(rBias), w.r(t), w.r(t))
	if w.isa.evex {
		w.ins("VCMPPS $3, %s, %s, K2", w.r(r), w.r(r))
		w.ins("KNOTW K2, K3")
		w.ins("VPADDD %s, %s, K3, %s", w.r(t), w.r(r), w.r(r))
		w.ins("VPORD %s, %s, K2, %s", w.r(rQuiet), w.r(r), w.r(r))
		return
	}
	m := rTmp1
	w.ins("VPADDD %s, %s, %s", w.r(r), w.r(t), w.r(t))
	w.ins("VCMPPS $3, %s, %s, %s", w.r(r), w.r(r), w.r(m))
	w.ins("VPOR %s, %s, %s", w.r(rQuiet), w.r(r), w.r(r))
	w.ins("VBLENDVPS %s, %s, %s, %s", w.r(m), w.r(r), w.r(t), w.r(r))
}

// op emits acc = acc op x for working kind k; x may be clobbered. Float min/max return NaN if either
// input is NaN (acc's NaN if both) and otherwise (acc < x ? acc : x), the same rule as the generic code.
func (w *emitter) op(k, op string, acc, x int) {
	A, X := w.r(acc), w.r(x)
	simple := map[string]map[string]string{
		"Sum":  {"u8": "VPADDB", "i8": "VPADDB", "i16": "VPADDW", "i32": "VPADDD", "i64": "VPADDQ", "f32": "VADDPS", "f64": "VADDPD"},
		"Min":  {"u8": "VPMINUB", "i8": "VPMINSB", "i16": "VPMINSW", "i32": "VPMINSD"},
		"Max":  {"u8": "VPMAXUB", "i8": "VPMAXSB", "i16": "VPMAXSW", "i32": "VPMAXSD"},
		"Prod": {"i16": "VPMULLW", "i32": "VPMULLD", "f32": "VMULPS", "f64": "VMULPD"},
	}
	if w.isa.evex {
		simple["Min"]["i64"] = "VPMINSQ"
		simple["Max"]["i64"] = "VPMAXSQ"
		simple["Prod"]["i64"] = "VPMULLQ"
	}
	if in, ok := simple[op][k]; ok {
		w.ins("%s %s, %s, %s", in, X, A, A)
		return
	}
	switch {
	case (k == "f32" || k == "f64") && (op == "Min" || op == "Max"):
		sfx := "PS"
		if k == "f64" {
			sfx = "PD"
		}
		in := "VMIN" + sfx
		if op == "Max" {
			in = "VMAX" + sfx
		}
		// VMINPS/VMAXPS return the second source (x) when either input is NaN; what is left is the
		// case where acc is the NaN.
		if w.isa.evex {
			w.ins("VCMP%s $7, %s, %s, K1", sfx, A, A)
			w.ins("%s %s, %s, K1, %s", in, X, A, A)
			return
		}
		t := w.r(rTmp0)
		w.ins("VCMP%s $3, %s, %s, %s", sfx, A, A, t)
		w.ins("%s %s, %s, %s", in, X, A, X)
		w.ins("VBLENDV%s %s, %s, %s, %s", sfx, t, A, X, A)
	case k == "i64" && (op == "Min" || op == "Max"):
		t := w.r(rTmp0)
		if op == "Min" {
			w.ins("VPCMPGTQ %s, %s, %s", X, A, t) // acc > x
		} else {
			w.ins("VPCMPGTQ %s, %s, %s", A, X, t) // x > acc
		}
		w.ins("VPBLENDVB %s, %s, %s, %s", t, X, A, A)
	case k == "i64" && op == "Prod":
		// lo(a)*lo(b) + (hi(a)*lo(b) + lo(a)*hi(b)) << 32, all mod 2^64.
		t1, t2 := w.r(rTmp0), w.r(rTmp1)
		w.ins("VPSRLQ $32, %s, %s", A, t1)
		w.ins("VPMULUDQ %s, %s, %s", X, t1, t1)
		w.ins("VPSRLQ $32, %s, %s", X, t2)
		w.ins("VPMULUDQ %s, %s, %s", A, t2, t2)
		w.ins("VPADDQ %s, %s, %s", t2, t1, t1)
		w.ins("VPSLLQ $32, %s, %s", t1, t1)
		w.ins("VPMULUDQ %s, %s, %s", X, A, A)
		w.ins("VPADDQ %s, %s, %s", t1, A, A)
	case (k == "u8" || k == "i8") && op == "Prod":
		// No byte multiply exists: multiply 16-bit words twice, once for the even bytes (the low byte of
		// a word product only depends on the low bytes) and once for the odd bytes shifted down.
		t := w.r(rTmp0)
		w.ins("VPMULLW %s, %s, %s", X, A, t)
		w.ins("%s %s, %s, %s", w.and(), w.r(rLow), t, t)
		w.ins("VPSRLW $8, %s, %s", A, A)
		w.ins("VPSRLW $8, %s, %s", X, X)
		w.ins("VPMULLW %s, %s, %s", X, A, A)
		w.ins("VPSLLW $8, %s, %s", A, A)
		w.ins("%s %s, %s, %s", w.or(), t, A, A)
	default:
		panic(fmt.Sprintf("no %s for %s", op, k))
	}
}

// prefetch emits one PREFETCHT0 per cache line of u vectors, prefetch bytes ahead, for each base (only
// in the unrolled loop: u > 1).
func (w *emitter) prefetch(u int, bases ...string) {
	if prefetch == 0 || u == 1 {
		return
	}
	for _, b := range bases {
		for off := 0; off < u*w.isa.vb; off += 64 {
			w.ins("PREFETCHT0 %s", mem(b, prefetch+off, 1))
		}
	}
}

// unroll is how many vectors of input one main-loop iteration handles.
func unroll(e elem) int {
	if e.half() {
		return 2
	}
	return 4
}

// regsOf returns the working registers for vector j starting at register base.
func regsOf(e elem, base, j int) []int {
	v := vecs(e)
	r := make([]int, v)
	for h := range r {
		r[h] = base + j*v + h
	}
	return r
}

// loop emits the standard two-level loop over AX in [0, CX): an unrolled body over u vectors, then
// single vectors. body(u) must handle u vectors at AX.
func (w *emitter) loop(u int, body func(u int)) {
	vb := w.isa.vb
	w.ins("XORQ AX, AX")
	w.ins("MOVQ CX, DX")
	w.ins("ANDQ $-%d, DX", u*vb)
	w.ins("JZ tail")
	w.label("loop")
	body(u)
	w.ins("ADDQ $%d, AX", u*vb)
	w.ins("CMPQ AX, DX")
	w.ins("JLT loop")
	w.label("tail")
	w.ins("CMPQ AX, CX")
	w.ins("JGE done")
	body(1)
	w.ins("ADDQ $%d, AX", vb)
	w.ins("JMP tail")
	w.label("done")
	w.ins("VZEROUPPER")
	w.ins("RET")
}

func (w *emitter) text(name string, args int) {
	fmt.Fprintf(&w.b, "\n// func %s\nTEXT ·%s(SB), NOSPLIT, $0-%d\n", name, name, args)
}

func (w *emitter) into(e elem, op string) string {
	name := "into" + e.name + op + w.isa.name
	w.text(name, 24)
	w.ins("MOVQ dst+0(FP), DI")
	w.ins("MOVQ src+8(FP), SI")
	w.ins("MOVQ n+16(FP), CX")
	w.consts(e, op)
	w.loop(unroll(e), func(u int) {
		w.prefetch(u, "DI", "SI")
		for j := 0; j < u; j++ {
			w.load(e, "DI", j*w.isa.vb, regsOf(e, 0, j))
			w.load(e, "SI", j*w.isa.vb, regsOf(e, 4, j))
		}
		for j := 0; j < u; j++ {
			a, x := regsOf(e, 0, j), regsOf(e, 4, j)
			for h := range a {
				w.op(e.work(), op, a[h], x[h])
			}
		}
		for j := 0; j < u; j++ {
			w.store(e, "DI", j*w.isa.vb, regsOf(e, 0, j))
		}
	})
	return name
}

// many reduces nsrc streams into dst in one pass: for each block, acc = srcs[0], then acc op= srcs[k]
// in order, then one store (one rounding for halves). dst may be any srcs[k]: a block is fully read
// before it is written.
func (w *emitter) many(e elem, op string) string {
	name := "many" + e.name + op + w.isa.name
	w.text(name, 32)
	w.ins("MOVQ dst+0(FP), DI")
	w.ins("MOVQ srcs+8(FP), R8")
	w.ins("MOVQ nsrc+16(FP), R9")
	w.ins("MOVQ n+24(FP), CX")
	w.consts(e, op)
	seq := 0
	w.loop(unroll(e), func(u int) {
		seq++
		next, store := fmt.Sprintf("next%d", seq), fmt.Sprintf("store%d", seq)
		w.ins("MOVQ (R8), SI")
		w.prefetch(u, "SI")
		for j := 0; j < u; j++ {
			w.load(e, "SI", j*w.isa.vb, regsOf(e, 0, j))
		}
		w.ins("MOVQ $1, BX")
		w.label(next)
		w.ins("CMPQ BX, R9")
		w.ins("JGE %s", store)
		w.ins("MOVQ (R8)(BX*8), SI")
		w.prefetch(u, "SI")
		for j := 0; j < u; j++ {
			w.load(e, "SI", j*w.isa.vb, regsOf(e, 4, j))
		}
		for j := 0; j < u; j++ {
			a, x := regsOf(e, 0, j), regsOf(e, 4, j)
			for h := range a {
				w.op(e.work(), op, a[h], x[h])
			}
		}
		w.ins("INCQ BX")
		w.ins("JMP %s", next)
		w.label(store)
		for j := 0; j < u; j++ {
			w.store(e, "DI", j*w.isa.vb, regsOf(e, 0, j))
		}
	})
	return name
}

// scale multiplies in place by a factor broadcast from the argument (float32 for f32 and halves).
func (w *emitter) scale(e elem) string {
	name := "scale" + e.name + w.isa.name
	mul, bc, args := "VMULPS", "VBROADCASTSS", 20
	if e.kind == "f64" {
		mul, bc, args = "VMULPD", "VBROADCASTSD", 24
	}
	w.text(name, args)
	w.ins("MOVQ buf+0(FP), DI")
	w.ins("MOVQ n+8(FP), CX")
	w.ins("%s f+16(FP), %s", bc, w.r(rFactor))
	w.consts(e, "Scale")
	w.loop(unroll(e), func(u int) {
		for j := 0; j < u; j++ {
			w.load(e, "DI", j*w.isa.vb, regsOf(e, 0, j))
		}
		for j := 0; j < u; j++ {
			for _, a := range regsOf(e, 0, j) {
				w.ins("%s %s, %s, %s", mul, w.r(rFactor), w.r(a), w.r(a))
			}
		}
		for j := 0; j < u; j++ {
			w.store(e, "DI", j*w.isa.vb, regsOf(e, 0, j))
		}
	})
	return name
}

// Conversions between contiguous float32 and halves. n counts bytes of halves, so the float32 side is
// addressed with AX*2.
func (w *emitter) toF32(e elem) string {
	name := "cvt" + e.name + "ToF32" + w.isa.name
	w.text(name, 24)
	w.ins("MOVQ dst+0(FP), DI")
	w.ins("MOVQ src+8(FP), SI")
	w.ins("MOVQ n+16(FP), CX")
	hv := w.isa.vb / 2 // bytes of halves that widen to one vector
	w.loop(2, func(u int) {
		for j := 0; j < 2*u; j++ {
			r := w.r(j)
			if e.kind == "f16" {
				w.ins("VCVTPH2PS %s, %s", mem("SI", j*hv, 1), r)
			} else {
				w.ins("VPMOVZXWD %s, %s", mem("SI", j*hv, 1), r)
				w.ins("VPSLLD $16, %s, %s", r, r)
			}
			w.ins("VMOVUPS %s, %s", r, mem("DI", j*w.isa.vb, 2))
		}
	})
	return name
}

func (w *emitter) fromF32(e elem) string {
	name := "cvtF32To" + e.name + w.isa.name
	w.text(name, 24)
	w.ins("MOVQ dst+0(FP), DI")
	w.ins("MOVQ src+8(FP), SI")
	w.ins("MOVQ n+16(FP), CX")
	if e.kind == "bf16" {
		w.bf16Consts()
	}
	hv := w.isa.vb / 2
	w.loop(2, func(u int) {
		if e.kind == "f16" {
			for j := 0; j < 2*u; j++ {
				w.ins("VMOVUPS %s, %s", mem("SI", j*w.isa.vb, 2), w.r(j))
				w.ins("VCVTPS2PH $0, %s, %s", w.r(j), mem("DI", j*hv, 1))
			}
			return
		}
		for j := 0; j < 2*u; j += 2 {
			r0, r1 := w.r(j), w.r(j+1)
			w.ins("VMOVUPS %s, %s", mem("SI", j*w.isa.vb, 2), r0)
			w.ins("VMOVUPS %s, %s", mem("SI", (j+1)*w.isa.vb, 2), r1)
			w.roundBF16(j)
			w.roundBF16(j + 1)
			w.ins("VPSRLD $16, %s, %s", r0, r0)
			w.ins("VPSRLD $16, %s, %s", r1, r1)
			if w.isa.evex {
				w.ins("VPMOVDW %s, %s", r0, mem("DI", j*hv, 1))
				w.ins("VPMOVDW %s, %s", r1, mem("DI", (j+1)*hv, 1))
			} else {
				// VPACKUSDW packs within 128-bit lanes; VPERMQ puts the quarters back in order.
				w.ins("VPACKUSDW %s, %s, %s", r1, r0, r0)
				w.ins("VPERMQ $0xD8, %s, %s", r0, r0)
				w.ins("VMOVDQU %s, %s", r0, mem("DI", j*hv, 1))
			}
		}
	})
	return name
}

// Generate returns the assembly and the Go declarations.
func Generate() (asmText, goText []byte, err error) {
	var s, g bytes.Buffer
	const header = "// Code generated by go run ./internal/gen; DO NOT EDIT.\n\n"
	s.WriteString(header)
	s.WriteString("//go:build !purego\n\n#include \"textflag.h\"\n")
	g.WriteString(header)
	g.WriteString("//go:build !purego\n\npackage reduce\n\nimport (\n\t\"unsafe\"\n\n\t\"github.com/kolo-dl/kolo/internal/dtype\"\n)\n")

	var all []isaTables
	for _, is := range isas {
		w := &emitter{isa: is}
		into := map[string]string{}
		many := map[string]string{}
		for _, e := range elems {
			for _, op := range ops {
				into[e.name+op] = w.into(e, op)
				many[e.name+op] = w.many(e, op)
			}
		}
		scale := map[string]string{}
		for _, e := range elems {
			if e.half() || e.kind == "f32" || e.kind == "f64" {
				scale[e.name] = w.scale(e)
			}
		}
		cvt := map[string]string{}
		for _, e := range elems {
			if e.half() {
				cvt[e.name+"ToF32"] = w.toF32(e)
				cvt["F32To"+e.name] = w.fromF32(e)
			}
		}
		s.Write(w.b.Bytes())

		// Go side: declarations.
		g.WriteString("\n")
		for _, e := range elems {
			for _, op := range ops {
				fmt.Fprintf(&g, "//go:noescape\nfunc %s(dst, src unsafe.Pointer, n int)\n\n", into[e.name+op])
				fmt.Fprintf(&g, "//go:noescape\nfunc %s(dst unsafe.Pointer, srcs *unsafe.Pointer, nsrc, n int)\n\n", many[e.name+op])
			}
		}
		for _, e := range elems {
			if n, ok := scale[e.name]; ok {
				ft := "float32"
				if e.kind == "f64" {
					ft = "float64"
				}
				fmt.Fprintf(&g, "//go:noescape\nfunc %s(buf unsafe.Pointer, n int, f %s)\n\n", n, ft)
			}
		}
		for _, k := range cvtKinds {
			fmt.Fprintf(&g, "//go:noescape\nfunc %s(dst, src unsafe.Pointer, n int)\n\n", cvt[k])
		}
		fmt.Fprintf(&g, "var kernels%s = kernelSet{name: %q, isa: isa%s, unit: %d}\n", is.name, lower(is.name), is.name, is.vb)
		all = append(all, isaTables{is, into, many, scale, cvt})
	}
	writeDispatch(&g, all)
	gs, err := format.Source(g.Bytes())
	if err != nil {
		return nil, nil, fmt.Errorf("gofmt generated Go: %w\n%s", err, g.Bytes())
	}
	return s.Bytes(), gs, nil
}

var cvtKinds = []string{"F16ToF32", "F32ToF16", "BF16ToF32", "F32ToBF16"}

type isaTables struct {
	isa                    isa
	into, many, scale, cvt map[string]string
}

// writeDispatch emits switch-based dispatchers. Direct calls, not tables of func values: an indirect
// call makes every pointer argument escape, which would put Many's stack array of source pointers on
// the heap on every call.
func writeDispatch(g *bytes.Buffer, all []isaTables) {
	g.WriteString("\nconst (\n")
	for i, t := range all {
		fmt.Fprintf(g, "\tisa%s isaID = %d\n", t.isa.name, i+1)
	}
	g.WriteString(")\n")

	perOp := func(sig, call string, names func(t isaTables) map[string]string) {
		fmt.Fprintf(g, "\nfunc %s {\n\tswitch isa {\n", sig)
		for _, t := range all {
			fmt.Fprintf(g, "\tcase isa%s:\n\t\tswitch t {\n", t.isa.name)
			for _, e := range elems {
				fmt.Fprintf(g, "\t\tcase dtype.%s:\n\t\t\tswitch op {\n", e.dt)
				for _, op := range ops {
					fmt.Fprintf(g, "\t\t\tcase %s:\n\t\t\t\t%s(%s)\n\t\t\t\treturn\n", op, names(t)[e.name+op], call)
				}
				g.WriteString("\t\t\t}\n")
			}
			g.WriteString("\t\t}\n")
		}
		g.WriteString("\t}\n\tpanic(\"reduce: no kernel for \" + t.String() + \" \" + op.String())\n}\n")
	}
	perOp("intoAsm(isa isaID, t dtype.DType, op Op, dst, src unsafe.Pointer, n int)", "dst, src, n",
		func(t isaTables) map[string]string { return t.into })
	perOp("manyAsm(isa isaID, t dtype.DType, op Op, dst unsafe.Pointer, srcs *unsafe.Pointer, nsrc, n int)",
		"dst, srcs, nsrc, n", func(t isaTables) map[string]string { return t.many })

	g.WriteString("\nfunc scaleAsm(isa isaID, t dtype.DType, buf unsafe.Pointer, n int, f float64) {\n\tswitch isa {\n")
	for _, t := range all {
		fmt.Fprintf(g, "\tcase isa%s:\n\t\tswitch t {\n", t.isa.name)
		for _, e := range elems {
			if n, ok := t.scale[e.name]; ok {
				arg := "float32(f)"
				if e.kind == "f64" {
					arg = "f"
				}
				fmt.Fprintf(g, "\t\tcase dtype.%s:\n\t\t\t%s(buf, n, %s)\n\t\t\treturn\n", e.dt, n, arg)
			}
		}
		g.WriteString("\t\t}\n")
	}
	g.WriteString("\t}\n\tpanic(\"reduce: no scale kernel for \" + t.String())\n}\n")

	g.WriteString("\nfunc cvtAsm(isa isaID, c cvtKind, dst, src unsafe.Pointer, n int) {\n\tswitch isa {\n")
	for _, t := range all {
		fmt.Fprintf(g, "\tcase isa%s:\n\t\tswitch c {\n", t.isa.name)
		for _, k := range cvtKinds {
			fmt.Fprintf(g, "\t\tcase cvt%s:\n\t\t\t%s(dst, src, n)\n\t\t\treturn\n", k, t.cvt[k])
		}
		g.WriteString("\t\t}\n")
	}
	g.WriteString("\t}\n\tpanic(\"reduce: no conversion kernel\")\n}\n")
}

func lower(s string) string { return string(bytes.ToLower([]byte(s))) }
