//go:build !amd64 || purego

package reduce

import (
	"unsafe"

	"github.com/kolo-dl/kolo/internal/dtype"
)

// available: no accelerated kernels off amd64 (or with the purego tag); everything runs generic Go,
// so the dispatchers below are never reached.
func available() []*kernelSet { return nil }

func intoAsm(isaID, dtype.DType, Op, unsafe.Pointer, unsafe.Pointer, int) {
	panic("reduce: no assembly")
}

func manyAsm(isaID, dtype.DType, Op, unsafe.Pointer, *unsafe.Pointer, int, int) {
	panic("reduce: no assembly")
}

func scaleAsm(isaID, dtype.DType, unsafe.Pointer, int, float64) { panic("reduce: no assembly") }

func cvtAsm(isaID, cvtKind, unsafe.Pointer, unsafe.Pointer, int) { panic("reduce: no assembly") }
