// Package dtype names the element types kolo moves and reduces, and their sizes.
//
// It is the one vocabulary every other package (reduce kernels, collectives, the engine, the C ABI)
// uses for "what is in these bytes". It must not depend on any other kolo package.
package dtype

import (
	"errors"
	"fmt"
	"math"
	"strings"
)

// DType is an element type. The zero value is invalid so that a forgotten field is caught.
type DType uint8

// The numeric values are part of the C ABI (capi) and the wire format: append only.
const (
	Invalid DType = iota
	Uint8
	Int8
	Int32
	Int64
	Float16
	BFloat16
	Float32
	Float64
	Int16 // appended after Float64: the values are fixed, so the list is not in size order
)

var names = [...]string{
	Invalid:  "invalid",
	Uint8:    "uint8",
	Int8:     "int8",
	Int32:    "int32",
	Int64:    "int64",
	Float16:  "float16",
	BFloat16: "bfloat16",
	Float32:  "float32",
	Float64:  "float64",
	Int16:    "int16",
}

var sizes = [...]int{Uint8: 1, Int8: 1, Int16: 2, Int32: 4, Int64: 8, Float16: 2, BFloat16: 2, Float32: 4, Float64: 8}

// All lists every valid DType, for table tests and flag help: integers by width, then floats (not in
// numeric order, which is append-only).
var All = []DType{Uint8, Int8, Int16, Int32, Int64, Float16, BFloat16, Float32, Float64}

// Size is the element size in bytes (0 for an invalid DType).
func (d DType) Size() int {
	if int(d) < len(sizes) {
		return sizes[d]
	}
	return 0
}

// ErrNegativeDim is matched (errors.Is) by Bytes' error for a shape with a negative dimension.
var ErrNegativeDim = errors.New("negative dimension")

// ErrTooLarge is matched (errors.Is) by Bytes' error for a tensor of more bytes than an int64
// counts, which no memory holds.
var ErrTooLarge = errors.New("more bytes than any memory holds")

// Bytes is the size in bytes of a dense tensor of element type d and shape: d.Size() times the
// product of the dimensions (0 for an invalid d). A shape with a zero dimension has no bytes,
// however large the others. It refuses, rather than wrap around, a negative dimension
// (ErrNegativeDim) and a size past math.MaxInt64 (ErrTooLarge), so that a shape such as
// [1<<62, 4] of float32 cannot pass for 0 bytes. It allocates only when it fails.
func Bytes(d DType, shape []int64) (int64, error) {
	zero := false
	for _, n := range shape {
		if n < 0 {
			return 0, fmt.Errorf("%w in shape %v", ErrNegativeDim, shape)
		}
		zero = zero || n == 0
	}
	if zero {
		return 0, nil
	}
	b := int64(d.Size())
	for _, n := range shape {
		if b > math.MaxInt64/n {
			return 0, fmt.Errorf("shape %v of %v: %w", shape, d, ErrTooLarge)
		}
		b *= n
	}
	return b, nil
}

// Valid reports whether d is one of the named types.
func (d DType) Valid() bool { return d != Invalid && int(d) < len(names) }

// IsFloat reports whether d is a floating-point type (scaling and averaging keep fractions).
func (d DType) IsFloat() bool {
	return d == Float16 || d == BFloat16 || d == Float32 || d == Float64
}

func (d DType) String() string {
	if int(d) < len(names) {
		return names[d]
	}
	return fmt.Sprintf("dtype(%d)", uint8(d))
}

// Parse accepts the names String returns plus the common aliases (f32, fp16, half, bf16, int, ...).
func Parse(s string) (DType, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "uint8", "u8", "byte":
		return Uint8, nil
	case "int8", "i8":
		return Int8, nil
	case "int16", "i16", "short":
		return Int16, nil
	case "int32", "i32", "int":
		return Int32, nil
	case "int64", "i64", "long":
		return Int64, nil
	case "float16", "f16", "fp16", "half":
		return Float16, nil
	case "bfloat16", "bf16":
		return BFloat16, nil
	case "float32", "f32", "fp32", "float":
		return Float32, nil
	case "float64", "f64", "fp64", "double":
		return Float64, nil
	}
	return Invalid, fmt.Errorf("unknown dtype %q (want one of %v)", s, All)
}
