package reduce

import (
	"fmt"
	"math"
	"unsafe"
)

// Float16BitsToFloat32 widens an IEEE binary16 value exactly (NaN stays NaN with its payload).
// Branch-light (after F. Giesen's half_to_float): move exponent and mantissa into place, rebias,
// and let one float subtraction normalise subnormals.
func Float16BitsToFloat32(h uint16) float32 {
	o := uint32(h&0x7fff) << 13
	exp := o & (0x1f << 23)
	o += (127 - 15) << 23
	if exp == 0x1f<<23 { // Inf or NaN: exponent all ones
		o += (128 - 16) << 23
	} else if exp == 0 { // zero or subnormal
		o = math.Float32bits(math.Float32frombits(o+1<<23) - 0x1p-14)
	}
	return math.Float32frombits(o | uint32(h&0x8000)<<16)
}

// Float32ToFloat16Bits rounds to the nearest binary16, ties to even; overflow gives ±Inf, NaN gives a
// quiet NaN with the same sign and the top payload bits (what VCVTPS2PH does). After F. Giesen's
// float_to_half_fast3_rtne: subnormal results are rounded by the FPU by adding a magic number that
// puts the half's last mantissa bit at the float's last; normal ones by integer rounding at bit 13.
func Float32ToFloat16Bits(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	b &^= 1 << 31
	switch {
	case b >= (127+16)<<23: // >= 65536 (rounds to Inf), Inf or NaN
		if b > 0xff<<23 {
			return sign | 0x7e00 | uint16(b>>13)&0x3ff
		}
		return sign | 0x7c00
	case b < (127-14)<<23: // below 2^-14: subnormal half or zero
		const magic = (127 - 15 + 23 - 10 + 1) << 23 // 0.5, so the sum's ulp is 2^-24
		return sign | uint16(math.Float32bits(math.Float32frombits(b)+math.Float32frombits(magic))-magic)
	}
	b = b - (127-15)<<23 + 0xfff + (b>>13)&1 // rebias, and round to nearest even at bit 13
	return sign | uint16(b>>13)
}

// BFloat16BitsToFloat32 widens a bfloat16 exactly.
func BFloat16BitsToFloat32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// Float32ToBFloat16Bits rounds to the nearest bfloat16, ties to even, keeping subnormals (unlike
// VCVTNEPS2BF16, which flushes them); NaN gives a quiet NaN with the same sign and top payload.
func Float32ToBFloat16Bits(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x40
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// Float32ToFloat16 rounds src into dst as native-endian binary16; len(dst) must be 2*len(src).
func Float32ToFloat16(dst []byte, src []float32) {
	checkConv("Float32ToFloat16", len(dst), len(src))
	off := 0
	if k := active; k != nil {
		off = convert(k, cvtF32ToF16, true, dst, src)
	}
	d := as[uint16](dst)
	for i := off / 2; i < len(src); i++ {
		d[i] = Float32ToFloat16Bits(src[i])
	}
}

// Float16ToFloat32 widens native-endian binary16 src into dst; len(src) must be 2*len(dst).
func Float16ToFloat32(dst []float32, src []byte) {
	checkConv("Float16ToFloat32", len(src), len(dst))
	off := 0
	if k := active; k != nil {
		off = convert(k, cvtF16ToF32, false, src, dst)
	}
	s := as[uint16](src)
	for i := off / 2; i < len(dst); i++ {
		dst[i] = Float16BitsToFloat32(s[i])
	}
}

// Float32ToBFloat16 rounds src into dst as native-endian bfloat16; len(dst) must be 2*len(src).
func Float32ToBFloat16(dst []byte, src []float32) {
	checkConv("Float32ToBFloat16", len(dst), len(src))
	off := 0
	if k := active; k != nil {
		off = convert(k, cvtF32ToBF16, true, dst, src)
	}
	d := as[uint16](dst)
	for i := off / 2; i < len(src); i++ {
		d[i] = Float32ToBFloat16Bits(src[i])
	}
}

// BFloat16ToFloat32 widens native-endian bfloat16 src into dst; len(src) must be 2*len(dst).
func BFloat16ToFloat32(dst []float32, src []byte) {
	checkConv("BFloat16ToFloat32", len(src), len(dst))
	off := 0
	if k := active; k != nil {
		off = convert(k, cvtBF16ToF32, false, src, dst)
	}
	s := as[uint16](src)
	for i := off / 2; i < len(dst); i++ {
		dst[i] = BFloat16BitsToFloat32(s[i])
	}
}

func checkConv(fn string, halfBytes, floats int) {
	if halfBytes != 2*floats {
		panic(fmt.Sprintf("reduce.%s: %d bytes of halves for %d float32s (want %d bytes)", fn, halfBytes, floats, 2*floats))
	}
}

// convert runs an assembly conversion over the whole vectors of halves and returns how many bytes of
// halves it did; the caller converts the rest. Kernels take (dst, src): narrow says dst is the halves.
func convert(k *kernelSet, c cvtKind, narrow bool, halves []byte, floats []float32) int {
	bulk := len(halves) &^ (k.unit - 1)
	for off := 0; off < bulk; off += chunkBytes {
		n := min(chunkBytes, bulk-off)
		h, fl := unsafe.Pointer(&halves[off]), unsafe.Pointer(&floats[off/2])
		if narrow {
			cvtAsm(k.isa, c, h, fl, n)
		} else {
			cvtAsm(k.isa, c, fl, h, n)
		}
	}
	return bulk
}
