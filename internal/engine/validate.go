package engine

import (
	"fmt"

	"github.com/kolo-dl/kolo/internal/dtype"
	"github.com/kolo-dl/kolo/internal/engine/negotiate"
)

// validate rejects, before negotiation, what is wrong on this rank alone.
// inLen and outLen are the input's and output's sizes in bytes.
func validate(req negotiate.Request, inLen, outLen int, size int) error {
	what := func() string { return fmt.Sprintf("%s %q", req.Kind, req.Name) }
	if req.Name == "" {
		return fmt.Errorf("%s: ops need a name (the API layer names unnamed ops)", req.Kind)
	}
	switch req.Kind {
	case negotiate.Barrier, negotiate.Join:
		return nil
	case negotiate.Allreduce, negotiate.Allgather, negotiate.Broadcast, negotiate.Alltoall, negotiate.ReduceScatter:
	default:
		return fmt.Errorf("%s: unknown op kind", what())
	}
	if !req.DType.Valid() {
		return fmt.Errorf("%s: invalid dtype %v", what(), req.DType)
	}
	n, err := dtype.Bytes(req.DType, req.Shape)
	if err != nil {
		return fmt.Errorf("%s: %w", what(), err) // never a size wrapped around to match the input
	}
	if int64(inLen) != n {
		return fmt.Errorf("%s: shape %v of %v needs %d bytes, input has %d", what(), req.Shape, req.DType, n, inLen)
	}
	if (req.Kind == negotiate.Allreduce || req.Kind == negotiate.Broadcast) && outLen != inLen {
		return fmt.Errorf("%s: output has %d bytes, input %d", what(), outLen, inLen)
	}
	if req.Kind == negotiate.Broadcast && (req.Root < 0 || req.Root >= size) {
		return fmt.Errorf("%s: root %d outside [0, %d)", what(), req.Root, size)
	}
	if req.Kind == negotiate.Alltoall && req.Splits != nil {
		if len(req.Splits) != size {
			return fmt.Errorf("%s: %d splits for %d ranks", what(), len(req.Splits), size)
		}
		var sum int64
		for _, s := range req.Splits {
			if s < 0 {
				return fmt.Errorf("%s: negative split in %v", what(), req.Splits)
			}
			sum += s
		}
		if len(req.Shape) == 0 || sum != req.Shape[0] {
			return fmt.Errorf("%s: splits %v sum to %d, dim 0 is %v", what(), req.Splits, sum, req.Shape)
		}
	}
	if req.Kind == negotiate.Alltoall && req.Splits == nil && len(req.Shape) > 0 && req.Shape[0]%int64(size) != 0 {
		return fmt.Errorf("%s: dim 0 (%d) is not divisible by %d ranks; pass splits", what(), req.Shape[0], size)
	}
	return nil
}
