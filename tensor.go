package kolo

import (
	"fmt"
	"unsafe"

	"github.com/kolo-dl/kolo/internal/dtype"
)

// DType is a tensor's element type (DTypeOf[T] gives each Element's); its String is the dtype's
// name as torch and numpy spell it.
type DType = dtype.DType

// Float16 and BFloat16 hold the raw bits of half-precision values (Go has no native halves).
type (
	Float16  uint16
	BFloat16 uint16
)

// Element is every Go type that maps to a kolo dtype.
type Element interface {
	~uint8 | ~int8 | ~int16 | ~int32 | ~int64 | ~float32 | ~float64 | Float16 | BFloat16
}

// DTypeOf returns the dtype of T.
func DTypeOf[T Element]() DType {
	var z T
	switch any(z).(type) {
	case uint8:
		return dtype.Uint8
	case int8:
		return dtype.Int8
	case int16:
		return dtype.Int16
	case int32:
		return dtype.Int32
	case int64:
		return dtype.Int64
	case float32:
		return dtype.Float32
	case float64:
		return dtype.Float64
	case Float16:
		return dtype.Float16
	case BFloat16:
		return dtype.BFloat16
	}
	panic(fmt.Sprintf("kolo: no dtype for %T", z))
}

// Of views s as a Tensor without copying: collectives read and write s itself. With no shape the
// tensor is one-dimensional of len(s) elements.
func Of[T Element](s []T, shape ...int64) Tensor {
	if len(shape) == 0 {
		shape = []int64{int64(len(s))}
	}
	var z T
	var data []byte
	if len(s) > 0 {
		data = unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), len(s)*int(unsafe.Sizeof(z)))
	} else {
		data = []byte{}
	}
	return Tensor{Data: data, DType: DTypeOf[T](), Shape: shape}
}

// As views t's data as a []T without copying; it panics if T does not match t.DType.
func As[T Element](t Tensor) []T {
	if want := DTypeOf[T](); want != t.DType {
		panic(fmt.Sprintf("kolo.As: tensor holds %v, not %v", t.DType, want))
	}
	var z T
	n := len(t.Data) / int(unsafe.Sizeof(z))
	if n == 0 {
		return []T{}
	}
	return unsafe.Slice((*T)(unsafe.Pointer(&t.Data[0])), n)
}
