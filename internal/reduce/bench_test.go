package reduce

// Benchmarks use warm buffers: first touch of fresh memory costs more than the kernels on these VMs,
// so every buffer is allocated and written once, outside the timer, and shared by all sub-benchmarks.
// Inputs are 1s of each type, so repeated sums/products never reach subnormals (which would measure
// the FPU's microcode assists, not the kernel).
//
// Bytes/s is len(dst) per second for Into, Scale, conversions (half side ×2, i.e. float32 bytes) and
// Copy, and total bytes read (nsrc × len(dst)) for Many.
//
//	go test -run '^$' -bench . ./internal/reduce/

import (
	"fmt"
	"testing"

	"github.com/kolo-dl/kolo/internal/dtype"
)

var benchSizes = []int{4 << 10, 256 << 10, 4 << 20, 64 << 20}

func sizeName(n int) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%dMiB", n>>20)
	}
	return fmt.Sprintf("%dKiB", n>>10)
}

// warm holds one 64 MiB (plus slack) buffer per role, each touched once.
var warm [10][]byte

func warmBuf(i, n int) []byte {
	if warm[i] == nil {
		warm[i] = make([]byte, 64<<20)
	}
	return warm[i][:n]
}

// ones fills b with the value 1 of type t.
func ones(t dtype.DType, b []byte) []byte {
	one := encodeOne(t)
	for i := 0; i < len(b); i += len(one) {
		copy(b[i:], one)
	}
	return b
}

func encodeOne(t dtype.DType) []byte {
	b := make([]byte, t.Size())
	switch t {
	case dtype.Uint8, dtype.Int8:
		b[0] = 1
	case dtype.Int16:
		ne.PutUint16(b, 1)
	case dtype.Int32:
		ne.PutUint32(b, 1)
	case dtype.Int64:
		ne.PutUint64(b, 1)
	case dtype.Float16:
		ne.PutUint16(b, 0x3c00)
	case dtype.BFloat16:
		ne.PutUint16(b, 0x3f80)
	case dtype.Float32:
		ne.PutUint32(b, 0x3f800000)
	case dtype.Float64:
		ne.PutUint64(b, 0x3ff0000000000000)
	}
	return b
}

func BenchmarkCopy(b *testing.B) {
	b.Logf("kernel: %s (usable: %v)", Kernel(), Kernels())
	benchCopies(b, func(dst, src []byte) { copy(dst, src) })
}

// BenchmarkStreamCopy is copy with streaming stores, in one core: it pays off only when another core
// reads the data (collective.SharedAllreduce); here it shows what the stores cost against copy.
func BenchmarkStreamCopy(b *testing.B) { benchCopies(b, StreamCopy) }

func benchCopies(b *testing.B, cp func(dst, src []byte)) {
	for _, n := range benchSizes {
		b.Run(sizeName(n), func(b *testing.B) {
			dst, src := warmBuf(0, n), ones(dtype.Uint8, warmBuf(1, n))
			cp(dst, src)
			b.SetBytes(int64(n))
			b.ResetTimer()
			for b.Loop() {
				cp(dst, src)
			}
		})
	}
}

func benchInto(b *testing.B, t dtype.DType, op Op, n int) {
	dst, src := ones(t, warmBuf(0, n)), ones(t, warmBuf(1, n))
	b.SetBytes(int64(n))
	b.ResetTimer()
	for b.Loop() {
		Into(t, op, dst, src)
	}
}

func BenchmarkInto(b *testing.B) {
	for _, t := range dtype.All {
		for _, op := range ops {
			for _, n := range benchSizes {
				b.Run(fmt.Sprintf("%v/%v/%s", t, op, sizeName(n)), func(b *testing.B) { benchInto(b, t, op, n) })
			}
		}
	}
}

// BenchmarkKernels compares the implementations on the types that matter most.
func BenchmarkKernels(b *testing.B) {
	for _, k := range Kernels() {
		for _, t := range []dtype.DType{dtype.Float32, dtype.Float16, dtype.BFloat16} {
			for _, n := range benchSizes {
				b.Run(fmt.Sprintf("%s/%v/sum/%s", k, t, sizeName(n)), func(b *testing.B) {
					withKernel(k, func() { benchInto(b, t, Sum, n) })
				})
			}
		}
	}
}

func BenchmarkMany(b *testing.B) {
	for _, t := range []dtype.DType{dtype.Float32, dtype.Float64, dtype.Float16, dtype.BFloat16, dtype.Int16, dtype.Int32} {
		for _, nsrc := range []int{2, 4, 8} {
			for _, n := range benchSizes[1:] {
				b.Run(fmt.Sprintf("%v/sum/srcs=%d/%s", t, nsrc, sizeName(n)), func(b *testing.B) {
					srcs := make([][]byte, nsrc)
					for k := range srcs {
						srcs[k] = ones(t, warmBuf(k+1, n))
					}
					dst := srcs[0] // as the shm allreduce does: reduce into one of the inputs
					b.SetBytes(int64(nsrc * n))
					b.ResetTimer()
					for b.Loop() {
						Many(t, Sum, dst, srcs...)
					}
				})
			}
		}
	}
}

func BenchmarkScale(b *testing.B) {
	for _, t := range []dtype.DType{dtype.Float32, dtype.Float64, dtype.Float16, dtype.BFloat16, dtype.Int16, dtype.Int32} {
		for _, n := range benchSizes {
			b.Run(fmt.Sprintf("%v/%s", t, sizeName(n)), func(b *testing.B) {
				buf := ones(t, warmBuf(0, n))
				b.SetBytes(int64(n))
				b.ResetTimer()
				for b.Loop() {
					Scale(t, buf, 1) // 1 keeps values steady; the kernels do not special-case it
				}
			})
		}
	}
}

func BenchmarkConvert(b *testing.B) {
	for _, n := range benchSizes {
		floats := as[float32](ones(dtype.Float32, warmBuf(0, n)))
		halves := warmBuf(1, n/2)
		for _, c := range []struct {
			name string
			f    func()
		}{
			{"f32-to-f16", func() { Float32ToFloat16(halves, floats) }},
			{"f16-to-f32", func() { Float16ToFloat32(floats, halves) }},
			{"f32-to-bf16", func() { Float32ToBFloat16(halves, floats) }},
			{"bf16-to-f32", func() { BFloat16ToFloat32(floats, halves) }},
		} {
			b.Run(fmt.Sprintf("%s/%s", c.name, sizeName(n)), func(b *testing.B) {
				c.f()
				b.SetBytes(int64(n))
				b.ResetTimer()
				for b.Loop() {
					c.f()
				}
			})
		}
	}
}
