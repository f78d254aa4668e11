package fake

import (
	"encoding/binary"
	"math"

	"github.com/kolo-dl/kolo/internal/gpu"
	"github.com/kolo-dl/kolo/internal/reduce"
)

var le = binary.LittleEndian

// number is what an element decodes to for arithmetic: half types compute in float32 and round
// back at every step, as NCCL's kernels do.
type number interface {
	~int8 | ~uint8 | ~int32 | ~uint32 | ~int64 | ~uint64 | ~float32 | ~float64
}

type codec[T number] struct {
	size int
	get  func([]byte) T
	put  func([]byte, T)
}

var (
	cInt8    = codec[int8]{1, func(b []byte) int8 { return int8(b[0]) }, func(b []byte, v int8) { b[0] = byte(v) }}
	cUint8   = codec[uint8]{1, func(b []byte) uint8 { return b[0] }, func(b []byte, v uint8) { b[0] = v }}
	cInt32   = codec[int32]{4, func(b []byte) int32 { return int32(le.Uint32(b)) }, func(b []byte, v int32) { le.PutUint32(b, uint32(v)) }}
	cUint32  = codec[uint32]{4, le.Uint32, le.PutUint32}
	cInt64   = codec[int64]{8, func(b []byte) int64 { return int64(le.Uint64(b)) }, func(b []byte, v int64) { le.PutUint64(b, uint64(v)) }}
	cUint64  = codec[uint64]{8, le.Uint64, le.PutUint64}
	cFloat32 = codec[float32]{4, func(b []byte) float32 { return math.Float32frombits(le.Uint32(b)) }, func(b []byte, v float32) { le.PutUint32(b, math.Float32bits(v)) }}
	cFloat64 = codec[float64]{8, func(b []byte) float64 { return math.Float64frombits(le.Uint64(b)) }, func(b []byte, v float64) { le.PutUint64(b, math.Float64bits(v)) }}
	cFloat16 = codec[float32]{2, func(b []byte) float32 { return reduce.Float16BitsToFloat32(le.Uint16(b)) },
		func(b []byte, v float32) { le.PutUint16(b, reduce.Float32ToFloat16Bits(v)) }}
	cBFloat16 = codec[float32]{2, func(b []byte) float32 { return reduce.BFloat16BitsToFloat32(le.Uint16(b)) },
		func(b []byte, v float32) { le.PutUint16(b, reduce.Float32ToBFloat16Bits(v)) }}
)

// reduceInto leaves in dst the reduction of srcs (one per rank, in rank order), as NCCL defines
// op: Avg of integers is the sum divided by the rank count (truncated), Avg of floats sums each
// input pre-multiplied by 1/n (NCCL's PreMulSum).
func reduceInto(t gpu.DataType, op gpu.RedOp, dst []byte, srcs [][]byte) {
	switch t {
	case gpu.Int8:
		reduceAs(cInt8, false, op, dst, srcs)
	case gpu.Uint8:
		reduceAs(cUint8, false, op, dst, srcs)
	case gpu.Int32:
		reduceAs(cInt32, false, op, dst, srcs)
	case gpu.Uint32:
		reduceAs(cUint32, false, op, dst, srcs)
	case gpu.Int64:
		reduceAs(cInt64, false, op, dst, srcs)
	case gpu.Uint64:
		reduceAs(cUint64, false, op, dst, srcs)
	case gpu.Float16:
		reduceAs(cFloat16, true, op, dst, srcs)
	case gpu.BFloat16:
		reduceAs(cBFloat16, true, op, dst, srcs)
	case gpu.Float32:
		reduceAs(cFloat32, true, op, dst, srcs)
	case gpu.Float64:
		reduceAs(cFloat64, true, op, dst, srcs)
	}
}

func reduceAs[T number](c codec[T], float bool, op gpu.RedOp, dst []byte, srcs [][]byte) {
	n := T(len(srcs))
	scratch := make([]byte, c.size)
	for off := 0; off+c.size <= len(dst); off += c.size {
		at := func(r int) T { return c.get(srcs[r][off:]) }
		var acc T
		if op == gpu.Avg && float {
			// Each product and each sum is rounded to the element type, as on the device.
			scaled := func(r int) T { c.put(scratch, at(r)*(1/n)); return c.get(scratch) }
			c.put(dst[off:], scaled(0))
			for r := 1; r < len(srcs); r++ {
				c.put(dst[off:], c.get(dst[off:])+scaled(r))
			}
			continue
		}
		c.put(dst[off:], at(0))
		for r := 1; r < len(srcs); r++ {
			a, x := c.get(dst[off:]), at(r)
			switch op {
			case gpu.Sum, gpu.Avg:
				acc = a + x
			case gpu.Prod:
				acc = a * x
			case gpu.Max:
				acc = max(a, x)
			case gpu.Min:
				acc = min(a, x)
			}
			c.put(dst[off:], acc)
		}
		if op == gpu.Avg {
			c.put(dst[off:], c.get(dst[off:])/n)
		}
	}
}
