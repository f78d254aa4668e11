package gpu

import (
	"fmt"

	"github.com/kolo-dl/kolo/internal/dtype"
)

// DataType is an element type NCCL reduces. Its values are NCCL's ncclDataType_t, so the real
// backend passes them through unchanged.
type DataType int32

// NCCL's ncclDataType_t values (nccl.h).
const (
	Int8     DataType = 0
	Uint8    DataType = 1
	Int32    DataType = 2
	Uint32   DataType = 3
	Int64    DataType = 4
	Uint64   DataType = 5
	Float16  DataType = 6
	Float32  DataType = 7
	Float64  DataType = 8
	BFloat16 DataType = 9
)

// DataTypes lists every DataType, for table tests.
var DataTypes = []DataType{Int8, Uint8, Int32, Uint32, Int64, Uint64, Float16, Float32, Float64, BFloat16}

var dataTypeNames = [...]string{"int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64", "bfloat16"}
var dataTypeSizes = [...]int{1, 1, 4, 4, 8, 8, 2, 4, 8, 2}

// Size is the element size in bytes (0 for an unknown value).
func (t DataType) Size() int {
	if t >= 0 && int(t) < len(dataTypeSizes) {
		return dataTypeSizes[t]
	}
	return 0
}

func (t DataType) String() string {
	if t >= 0 && int(t) < len(dataTypeNames) {
		return dataTypeNames[t]
	}
	return fmt.Sprintf("DataType(%d)", int32(t))
}

// FromDType is the DataType of a kolo element type; int16 has none (NCCL does not reduce it),
// so such tensors take the staged path.
func FromDType(d dtype.DType) (DataType, error) {
	switch d {
	case dtype.Int8:
		return Int8, nil
	case dtype.Uint8:
		return Uint8, nil
	case dtype.Int32:
		return Int32, nil
	case dtype.Int64:
		return Int64, nil
	case dtype.Float16:
		return Float16, nil
	case dtype.BFloat16:
		return BFloat16, nil
	case dtype.Float32:
		return Float32, nil
	case dtype.Float64:
		return Float64, nil
	}
	return 0, fmt.Errorf("%w: NCCL has no %s", ErrUnavailable, d)
}

// RedOp is a reduction. Its values are NCCL's ncclRedOp_t.
type RedOp int32

// NCCL's ncclRedOp_t values (nccl.h). Avg is the sum divided by the rank count (integer
// division for integer types).
const (
	Sum  RedOp = 0
	Prod RedOp = 1
	Max  RedOp = 2
	Min  RedOp = 3
	Avg  RedOp = 4
)

// RedOps lists every RedOp, for table tests.
var RedOps = []RedOp{Sum, Prod, Max, Min, Avg}

func (o RedOp) String() string {
	switch o {
	case Sum:
		return "sum"
	case Prod:
		return "prod"
	case Max:
		return "max"
	case Min:
		return "min"
	case Avg:
		return "avg"
	}
	return fmt.Sprintf("RedOp(%d)", int32(o))
}
