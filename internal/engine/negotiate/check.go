package negotiate

import (
	"fmt"
	"slices"
	"strings"
)

// negotiate checks that the ranks in present (ascending) agree on the op they submitted (reqs is
// indexed by rank) and builds its sig; absent are the joined ranks that did not submit it. On
// disagreement it returns the message every rank fails the op with: it names the op, the tensor and
// what each rank sent, grouped by value, e.g.
//
//	allreduce "grad.w1": mismatched shapes: ranks 0,2 sent [4 5] float32; rank 1 sent [4 6] float32
//
// Checks run in a fixed order (kind, group, dtype, device, shape, reduce op, scale factors, root,
// splits) and
// the first that fails is reported: later ones would only repeat its cause.
func negotiate(name string, size int, reqs []Request, present, absent []int, ids jobRanks) (*opSig, string) {
	first := &reqs[present[0]]
	kind := first.Kind
	fail := func(format string, args ...any) (*opSig, string) {
		return nil, fmt.Sprintf("%s %q: ", kind, name) + fmt.Sprintf(format, args...)
	}
	if refused := refusals(reqs, present); refused != nil {
		// What the refusing ranks sent is not an op to compare: their reasons are the error.
		parts := make([]string, len(refused))
		for i, v := range refused {
			parts[i] = ids.word(v.ranks) + " refused it: " + v.key
		}
		return fail("%s", strings.Join(parts, "; "))
	}
	// The tallies below build the error message; they run only when this cheap comparison has
	// found a disagreement.
	agreed := allAgree(reqs, present)
	if v := tallyIf(!agreed, present, func(r int) string { return reqs[r].Kind.String() }); len(v) > 1 {
		return fail("mismatched ops: %s", ids.describe(v))
	}
	if kind == InvalidOp || kind > Barrier {
		return fail("not an op a rank can submit")
	}
	s := &opSig{name: name, kind: kind}
	if v := tallyIf(!agreed, present, func(r int) string {
		if reqs[r].Group == 0 {
			return "no group"
		}
		return fmt.Sprintf("group %d of %d", reqs[r].Group, reqs[r].GroupSize)
	}); len(v) > 1 {
		return fail("mismatched groups: %s", ids.describe(v))
	}
	if first.Group != 0 {
		if first.GroupSize < 1 {
			return fail("group %d has size %d", first.Group, first.GroupSize)
		}
		s.group, s.groupSize = first.Group, first.GroupSize
	}
	if kind == Barrier {
		s.partial = len(absent) > 0
		return s, ""
	}
	if kind != Allreduce && len(absent) > 0 && !strings.HasPrefix(name, SetChangePrefix) {
		// As Horovod: a joined rank contributes zeros to an allreduce, and to nothing else (what
		// would it gather, scatter or broadcast?).
		return fail("not supported while %s joined: only allreduce runs with joined ranks", ids.have(absent))
	}

	if v := tallyIf(!agreed, present, func(r int) string { return reqs[r].DType.String() }); len(v) > 1 {
		return fail("mismatched dtypes: %s", ids.describe(v))
	}
	if !first.DType.Valid() {
		return fail("invalid dtype %v", first.DType)
	}
	s.dtype = first.DType
	if v := tallyIf(!agreed, present, func(r int) string { return deviceName(reqs[r].GPU) }); len(v) > 1 {
		return fail("mismatched devices (CPU and GPU tensors): %s", ids.describe(v))
	}
	s.gpu = first.GPU

	if varyDim0(kind) {
		var scalars []int
		for _, r := range present {
			if len(reqs[r].Shape) == 0 {
				scalars = append(scalars, r)
			}
		}
		if len(scalars) > 0 {
			return fail("%s sent a scalar: %s needs at least one dimension", ids.word(scalars), kind)
		}
		if v := tallyIf(!agreed, present, func(r int) string {
			return freeDim0Shape(reqs[r].Shape) + " " + reqs[r].DType.String()
		}); len(v) > 1 {
			return fail("mismatched shapes (all dims but the first must agree): %s", ids.describe(v))
		}
	} else if v := tallyIf(!agreed, present, func(r int) string {
		return formatShape(reqs[r].Shape) + " " + reqs[r].DType.String()
	}); len(v) > 1 {
		return fail("mismatched shapes: %s", ids.describe(v))
	}
	var negative []int
	for _, r := range present {
		if slices.ContainsFunc(reqs[r].Shape, func(d int64) bool { return d < 0 }) {
			negative = append(negative, r)
		}
	}
	if len(negative) > 0 {
		return fail("negative dimension: %s", ids.describe(tally(negative, func(r int) string { return formatShape(reqs[r].Shape) })))
	}

	if usesReduce(kind) {
		if v := tallyIf(!agreed, present, func(r int) string { return ReduceOpName(reqs[r].ReduceOp, reqs[r].Average) }); len(v) > 1 {
			return fail("mismatched reduce ops: %s", ids.describe(v))
		}
		if first.ReduceOp < ReduceSum || first.ReduceOp > ReduceAdasum {
			return fail("unknown reduce op %s", ReduceOpName(first.ReduceOp, false))
		}
		if first.Average && first.ReduceOp != ReduceSum {
			return fail("average needs reduce op sum, not %s", ReduceOpName(first.ReduceOp, false))
		}
		if first.ReduceOp == ReduceAdasum {
			switch {
			case kind != Allreduce:
				return fail("Adasum is an allreduce only, not a %s", kind)
			case !first.DType.IsFloat():
				return fail("Adasum needs a floating-point dtype, not %v", first.DType)
			case len(absent) > 0:
				return fail("Adasum is not supported with join (%s joined)", ids.have(absent))
			}
		}
		if v := tallyIf(!agreed, present, func(r int) string {
			return fmt.Sprintf("prescale %g postscale %g", scale(reqs[r].PreScale), scale(reqs[r].PostScale))
		}); len(v) > 1 {
			return fail("mismatched scale factors: %s", ids.describe(v))
		}
		s.reduceOp, s.average = first.ReduceOp, first.Average
		s.pre, s.post = scale(first.PreScale), scale(first.PostScale)
	}

	if kind == Broadcast {
		if v := tallyIf(!agreed, present, func(r int) string { return fmt.Sprintf("root %d", ids.of(reqs[r].Root)) }); len(v) > 1 {
			return fail("mismatched roots: %s", ids.describe(v))
		}
		if first.Root < 0 || first.Root >= size {
			return fail("root %d out of range [0,%d)", first.Root, size)
		}
		s.root = first.Root
	}

	s.partial = len(absent) > 0
	switch kind {
	case Allgather:
		s.dim0 = make([]int64, size)
		var total int64
		for _, r := range present {
			s.dim0[r] = reqs[r].Shape[0]
			total = satAdd(total, reqs[r].Shape[0])
		}
		s.shape = slices.Clone(first.Shape)
		s.shape[0] = total
	case Alltoall:
		s.splits = make([][]int64, size)
		var total int64
		for _, r := range present {
			q := &reqs[r]
			rows := q.Shape[0]
			switch {
			case q.Splits == nil && rows%int64(size) != 0:
				return fail("rank %d sent %d rows and no splits: dim 0 must divide evenly by %d ranks", ids.of(r), rows, size)
			case q.Splits == nil:
				s.splits[r] = equalSplit(rows, size)
			case len(q.Splits) != size:
				return fail("rank %d sent %d splits, want one per rank (%d)", ids.of(r), len(q.Splits), size)
			case slices.ContainsFunc(q.Splits, func(v int64) bool { return v < 0 }):
				return fail("rank %d sent negative splits %s", ids.of(r), formatShape(q.Splits))
			default:
				var sum int64
				for _, v := range q.Splits {
					sum = satAdd(sum, v)
				}
				if sum != rows {
					return fail("rank %d sent splits %s summing to %d for %d rows", ids.of(r), formatShape(q.Splits), sum, rows)
				}
				s.splits[r] = q.Splits
			}
			total = satAdd(total, rows)
		}
		s.shape = slices.Clone(first.Shape)
		s.shape[0] = total
	default:
		s.shape = first.Shape
	}
	s.computeBytes()
	return s, ""
}

// refusals groups the ranks in present that refused the op (Request.Error) by reason; nil when
// none did.
func refusals(reqs []Request, present []int) []vote {
	for _, r := range present {
		if reqs[r].Error != "" {
			var refused []int
			for _, q := range present {
				if reqs[q].Error != "" {
					refused = append(refused, q)
				}
			}
			return tally(refused, func(q int) string { return reqs[q].Error })
		}
	}
	return nil
}

// have writes "rank 3 has" or "ranks 0,2 have", in job ranks.
func (j jobRanks) have(ranks []int) string {
	ranks = j.all(ranks)
	if len(ranks) == 1 {
		return fmt.Sprintf("rank %d has", ranks[0])
	}
	return "ranks " + formatRanks(ranks) + " have"
}

// vote is the ranks that sent one value.
type vote struct {
	key   string
	ranks []int
}

// tally groups ranks by key, in order of each key's lowest rank.
func tally(ranks []int, key func(r int) string) []vote {
	var out []vote
	for _, r := range ranks {
		k := key(r)
		i := slices.IndexFunc(out, func(v vote) bool { return v.key == k })
		if i < 0 {
			out = append(out, vote{key: k})
			i = len(out) - 1
		}
		out[i].ranks = append(out[i].ranks, r)
	}
	return out
}

// describe writes "ranks 0,2 sent X; rank 1 sent Y", in job ranks.
func (j jobRanks) describe(votes []vote) string {
	parts := make([]string, len(votes))
	for i, v := range votes {
		parts[i] = j.word(v.ranks) + " sent " + v.key
	}
	return strings.Join(parts, "; ")
}

// freeDim0Shape writes a shape whose dim 0 may differ across ranks as "[* 5]".
func freeDim0Shape(shape []int64) string {
	t := formatShape(shape[1:])
	if len(t) == 2 {
		return "[*]"
	}
	return "[* " + t[1:]
}

// tallyIf is tally when the ranks may disagree, and nothing (no allocation) when they cannot.
func tallyIf(disagree bool, ranks []int, key func(r int) string) []vote {
	if !disagree {
		return nil
	}
	return tally(ranks, key)
}

// allAgree reports whether every rank in present sent the same values for everything the
// tallies in negotiate compare: the common case, checked without building strings.
func allAgree(reqs []Request, present []int) bool {
	a := &reqs[present[0]]
	for _, r := range present[1:] {
		b := &reqs[r]
		if b.Kind != a.Kind || b.Group != a.Group || (a.Group != 0 && b.GroupSize != a.GroupSize) {
			return false
		}
		if !usesData(a.Kind) {
			continue
		}
		if b.DType != a.DType || b.GPU != a.GPU {
			return false
		}
		if varyDim0(a.Kind) {
			if len(a.Shape) != len(b.Shape) || (len(a.Shape) > 0 && !slices.Equal(a.Shape[1:], b.Shape[1:])) {
				return false
			}
		} else if !slices.Equal(a.Shape, b.Shape) {
			return false
		}
		if usesReduce(a.Kind) && (b.ReduceOp != a.ReduceOp || b.Average != a.Average ||
			scale(b.PreScale) != scale(a.PreScale) || scale(b.PostScale) != scale(a.PostScale)) {
			return false
		}
		if a.Kind == Broadcast && b.Root != a.Root {
			return false
		}
	}
	return true
}

// deviceName is what a mismatch error says a rank's tensor lived on.
func deviceName(gpu bool) string {
	if gpu {
		return "a GPU tensor"
	}
	return "a CPU tensor"
}
