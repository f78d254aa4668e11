package negotiate

import (
	"math"
	"slices"

	"github.com/kolo-dl/kolo/internal/dtype"
)

// opSig is an op as negotiated across all ranks: what a Response says about one tensor, and what a
// cache entry stands for. Fields the kind does not use are zero, so that two sigs of the same op
// compare equal however the ranks filled the unused fields. A sig is immutable once built: cache
// entries, pending ops and Responses share it.
type opSig struct {
	name      string
	kind      OpKind
	dtype     dtype.DType
	reduceOp  uint8
	average   bool
	gpu       bool
	root      int
	pre, post float64 // 0 already replaced by 1
	group     int64
	groupSize int
	// shape is as in Response.Shapes: for Allgather and Alltoall dim 0 is the total over ranks.
	shape []int64
	// dim0, for Allgather, is the rows of each rank.
	dim0 []int64
	// splits, for Alltoall, is [src][dst] rows, equal splits written out.
	splits [][]int64
	// partial: some ranks joined without submitting, so no rank's view is complete; never cached.
	partial bool
	// bytes is what the op adds to a fusion buffer.
	bytes int64
}

func scale(x float64) float64 {
	if x == 0 {
		return 1
	}
	return x
}

// uses* say which Request fields a kind reads; the rest are ignored everywhere.
func usesData(k OpKind) bool   { return k != Barrier }
func usesReduce(k OpKind) bool { return k == Allreduce || k == ReduceScatter }
func varyDim0(k OpKind) bool   { return k == Allgather || k == Alltoall }

// equalSplit is the row count each rank gets when an Alltoall gives no Splits.
func equalSplit(rows int64, size int) []int64 {
	s := make([]int64, size)
	for i := range s {
		s[i] = rows / int64(size)
	}
	return s
}

// matches reports whether r is exactly what rank would submit for s: the test behind a cache hit.
func (s *opSig) matches(rank, size int, r *Request) bool {
	gs := 0
	if r.Group != 0 {
		gs = r.GroupSize
	}
	if r.Name != s.name || r.Kind != s.kind || r.Group != s.group || gs != s.groupSize {
		return false
	}
	if !usesData(s.kind) {
		return true
	}
	if r.DType != s.dtype || r.GPU != s.gpu {
		return false
	}
	if usesReduce(s.kind) {
		if r.ReduceOp != s.reduceOp || r.Average != s.average || scale(r.PreScale) != s.pre || scale(r.PostScale) != s.post {
			return false
		}
	}
	if s.kind == Broadcast && r.Root != s.root {
		return false
	}
	if !varyDim0(s.kind) {
		return slices.Equal(r.Shape, s.shape)
	}
	if len(r.Shape) != len(s.shape) || len(r.Shape) == 0 || !slices.Equal(r.Shape[1:], s.shape[1:]) {
		return false
	}
	if s.kind == Allgather {
		return r.Shape[0] == s.dim0[rank]
	}
	mine := s.splits[rank]
	if r.Splits == nil {
		if r.Shape[0]%int64(size) != 0 {
			return false
		}
		for _, v := range mine {
			if v != r.Shape[0]/int64(size) {
				return false
			}
		}
		return true
	}
	var sum int64
	for _, v := range mine {
		sum += v
	}
	return r.Shape[0] == sum && slices.Equal(r.Splits, mine)
}

// requestFor rebuilds the Request rank submitted for s (with explicit splits and scales).
func (s *opSig) requestFor(rank int) Request {
	r := Request{Name: s.name, Kind: s.kind, DType: s.dtype, ReduceOp: s.reduceOp, Average: s.average,
		GPU: s.gpu, Root: s.root, PreScale: s.pre, PostScale: s.post, Group: s.group, GroupSize: s.groupSize}
	if !usesData(s.kind) {
		return r
	}
	r.Shape = slices.Clone(s.shape)
	switch s.kind {
	case Allgather:
		r.Shape[0] = s.dim0[rank]
	case Alltoall:
		r.Splits = slices.Clone(s.splits[rank])
		var sum int64
		for _, v := range r.Splits {
			sum += v
		}
		r.Shape[0] = sum
	}
	return r
}

func sigEqual(a, b *opSig) bool {
	if a == b {
		return true
	}
	if a.name != b.name || a.kind != b.kind || a.dtype != b.dtype || a.reduceOp != b.reduceOp ||
		a.average != b.average || a.gpu != b.gpu || a.root != b.root || a.pre != b.pre || a.post != b.post ||
		a.group != b.group || a.groupSize != b.groupSize || a.partial != b.partial ||
		!slices.Equal(a.shape, b.shape) || !slices.Equal(a.dim0, b.dim0) || len(a.splits) != len(b.splits) {
		return false
	}
	for i := range a.splits {
		if !slices.Equal(a.splits[i], b.splits[i]) {
			return false
		}
	}
	return true
}

// computeBytes is the op's share of a fusion buffer: the output for Allgather, the input
// otherwise. It saturates rather than overflow on absurd shapes (or negative dimensions, which
// only a garbled Response carries).
func (s *opSig) computeBytes() {
	if !usesData(s.kind) {
		s.bytes = 0
		return
	}
	n, err := dtype.Bytes(s.dtype, s.shape)
	if err != nil {
		n = math.MaxInt64
	}
	s.bytes = n
}

func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// sigFromResponse rebuilds the sig of r.Names[i], as the Coordinator built it.
func sigFromResponse(r *Response, i int) *opSig {
	s := &opSig{name: r.Names[i], kind: r.Kind, dtype: r.DType, reduceOp: r.ReduceOp, average: r.Average,
		gpu: r.GPU && usesData(r.Kind), root: r.Root, pre: r.PreScale, post: r.PostScale, group: r.Group, groupSize: r.GroupSize}
	if i < len(r.Shapes) {
		s.shape = r.Shapes[i]
	}
	if r.Kind == Allgather && i < len(r.Dim0) {
		s.dim0 = r.Dim0[i]
	}
	if r.Kind == Alltoall {
		s.splits = r.Splits
	}
	// Zero what the kind does not use, as negotiate does, so that whatever a Response carries the
	// entry matches the requests it stands for.
	if usesReduce(s.kind) {
		s.pre, s.post = scale(s.pre), scale(s.post)
	} else {
		s.reduceOp, s.average, s.pre, s.post = 0, false, 0, 0
	}
	if s.kind != Broadcast {
		s.root = 0
	}
	if s.group == 0 {
		s.groupSize = 0
	}
	if !usesData(s.kind) {
		s.dtype, s.shape = 0, nil
	}
	s.computeBytes()
	return s
}

// validForCache reports whether a sig rebuilt from a Response has the per-rank data a cache
// entry needs, so that a garbled Response cannot make Lookup index out of range.
func (s *opSig) validForCache(size int) bool {
	switch s.kind {
	case Allgather:
		return len(s.shape) > 0 && len(s.dim0) == size
	case Alltoall:
		if len(s.shape) == 0 || len(s.splits) != size {
			return false
		}
		for _, row := range s.splits {
			if len(row) != size {
				return false
			}
		}
	case InvalidOp, Join:
		return false
	}
	return true
}
