// Package dtype names the element types kolo moves and reduces, and their sizes.
//
// It is the one vocabulary every other package (reduce kernels, collectives, the engine, the C ABI)
// uses for "what is in these bytes". It must not depend on any other kolo package.
package dtype

import (
	"fmt"
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
}

var sizes = [...]int{Uint8: 1, Int8: 1, Int32: 4, Int64: 8, Float16: 2, BFloat16: 2, Float32: 4, Float64: 8}

// All lists every valid DType, for table tests and flag help.
var All = []DType{Uint8, Int8, Int32, Int64, Float16, BFloat16, Float32, Float64}

// Size is the element size in bytes (0 for an invalid DType).
func (d DType) Size() int {
	if int(d) < len(sizes) {
		return sizes[d]
	}
	return 0
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
