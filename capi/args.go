package main

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"unsafe"

	"github.com/kolo-dl/kolo"
	"github.com/kolo-dl/kolo/internal/dtype"
)

// Argument checks. A C caller can pass anything: a null pointer, a negative length, a dtype code
// from another library. Go code that trusts such a value panics (unsafe.Slice, slice bounds, a nil
// dereference), and a Go panic inside a c-shared library kills the host process, Python and all,
// with a Go stack trace. So every exported function converts its C arguments here first, and a
// bad one becomes that function's ordinary error (a failed handle, or -1 with kolo_last_error)
// naming the argument and its value.
//
// Pointers are checked for what can be checked: null, and a length that would run past the end of
// the address space. That a non-null pointer really covers the bytes its shape claims is the
// caller's promise (torch's data_ptr() and numel() keep it).

// argError is a C argument that an exported function refused. It is built on the checks' error
// paths only, and formatted only when read: the checks run on every call (every member of a group),
// and a valid call allocates nothing for them.
type argError struct {
	arg   string // the parameter's name in the C signature
	index int    // the element of array parameter arg that was refused, or whole (-1): arg itself
	value any    // what the caller passed ("NULL" for a null pointer)
	why   string
}

// whole is argError.index for an argument refused as a whole, not one element of an array.
const whole = -1

func (e *argError) Error() string {
	if e.index != whole {
		return fmt.Sprintf("argument %s[%d] = %v: %s", e.arg, e.index, e.value, e.why)
	}
	return fmt.Sprintf("argument %s = %v: %s", e.arg, e.value, e.why)
}

const null = "NULL" // a null pointer, as an argError shows it

// cArray is the n elements of T at p, in the caller's memory (not copied): nil for n == 0. arg
// and countArg name the pointer and the count in the C signature.
func cArray[T any](arg, countArg string, p unsafe.Pointer, n int) ([]T, error) {
	if n < 0 {
		return nil, &argError{countArg, whole, n, "negative"}
	}
	if n == 0 {
		return nil, nil
	}
	if p == nil {
		return nil, &argError{arg, whole, null, fmt.Sprintf("but %s = %d", countArg, n)}
	}
	var zero T
	if err := checkExtent(arg, whole, p, uint64(n)*uint64(unsafe.Sizeof(zero))); err != nil {
		return nil, err
	}
	return unsafe.Slice((*T)(p), n), nil
}

// checkExtent refuses nbytes at p, argument arg (element index of it, or whole), that would run
// past the end of the address space (unsafe.Slice panics on those).
func checkExtent(arg string, index int, p unsafe.Pointer, nbytes uint64) error {
	if nbytes > uint64(math.MaxInt) || uintptr(nbytes) > -uintptr(p) {
		return &argError{arg, index, p, fmt.Sprintf("%d bytes from there run past the end of the address space", nbytes)}
	}
	return nil
}

// cString copies the n bytes at p (not NUL-terminated); a null p with n == 0 is "".
func cString(arg, lenArg string, p unsafe.Pointer, n int) (string, error) {
	b, err := cArray[byte](arg, lenArg, p, n)
	return string(b), err
}

// cInt64s copies the n int64s at p: kolo keeps shapes and splits after the call returns.
func cInt64s(arg, countArg string, p unsafe.Pointer, n int) ([]int64, error) {
	s, err := cArray[int64](arg, countArg, p, n)
	if err != nil || s == nil {
		return nil, err
	}
	return append([]int64(nil), s...), nil
}

// dtypeCodes lists the dtype codes for error messages, by code: "1 uint8, 2 int8, ..., 9 int16".
var dtypeCodes = func() string {
	var b strings.Builder
	for i, d := range slices.Sorted(slices.Values(dtype.All)) {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%d %v", int(d), d)
	}
	return b.String()
}()

// cDType is the dtype with C code v, passed as arg (element index of it, or whole).
func cDType(arg string, index, v int) (dtype.DType, error) {
	if v <= 0 || v > math.MaxUint8 || !dtype.DType(v).Valid() {
		return dtype.Invalid, &argError{arg, index, v, "not a dtype code (" + dtypeCodes + ")"}
	}
	return dtype.DType(v), nil
}

// cReduceOp is the reduction with horovod's code v.
func cReduceOp(arg string, v int) (kolo.Op, error) {
	switch op := kolo.Op(v); op {
	case kolo.Average, kolo.Sum, kolo.Adasum, kolo.Min, kolo.Max, kolo.Product:
		return op, nil
	}
	return 0, &argError{arg, whole, v, "not a reduction code (0 Average, 1 Sum, 2 Adasum, 3 Min, 4 Max, 5 Product)"}
}

// cKind checks an op kind code.
func cKind(arg string, v int) error {
	if v < kindAllreduce || v > kindJoin {
		return &argError{arg, whole, v, "not an op kind (1 allreduce, 2 allgather, 3 broadcast, 4 alltoall, " +
			"5 reducescatter, 6 barrier, 7 join)"}
	}
	return nil
}

// notNegative checks a rank, id or count that may not be negative.
func notNegative[T ~int | ~int32 | ~int64](arg string, v T) error {
	if v < 0 {
		return &argError{arg, whole, v, "negative"}
	}
	return nil
}

// tensorBytes is the size of a tensor of dtype dt and shape, refusing negative dimensions and
// sizes no memory could hold.
func tensorBytes(arg string, dt dtype.DType, shape []int64) (int64, error) {
	for i, d := range shape {
		if d < 0 {
			return 0, &argError{arg, i, d, fmt.Sprintf("negative dimension in shape %v", shape)}
		}
	}
	n := int64(dt.Size())
	for _, d := range shape {
		if d == 0 {
			return 0, nil
		}
		if n > math.MaxInt64/d {
			return 0, &argError{arg, whole, shape, fmt.Sprintf("more bytes of %v than any memory holds", dt)}
		}
		n *= d
	}
	return n, nil
}

// cTensor is the caller's tensor at p, which is argument arg (element index of it, or whole):
// dtype dt and shape as given (copied), the elements off.. of the C argument shapeArg (which
// errors name). A null p is allowed only for a tensor of no elements.
func cTensor(arg string, index int, p unsafe.Pointer, dt dtype.DType, shapeArg string, off int,
	shape []int64) (kolo.Tensor, error) {
	if shape == nil {
		shape = []int64{}
	}
	t := kolo.Tensor{DType: dt, Shape: shape, Data: []byte{}}
	n, err := tensorBytes(shapeArg, dt, shape)
	if err != nil {
		var ae *argError
		if errors.As(err, &ae) && ae.index != whole {
			ae.index += off // a dimension, as the caller's array numbers it
		}
		return t, err
	}
	if n == 0 {
		return t, nil
	}
	if p == nil {
		return t, &argError{arg, index, null, fmt.Sprintf("but shape %v of %v needs %d bytes", shape, dt, n)}
	}
	if err := checkExtent(arg, index, p, uint64(n)); err != nil {
		return t, err
	}
	t.Data = unsafe.Slice((*byte)(p), n)
	return t, nil
}
