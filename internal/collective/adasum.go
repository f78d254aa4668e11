package collective

import (
	"context"
	"fmt"
	"unsafe"

	"github.com/kolo-dl/kolo/internal/dtype"
	"github.com/kolo-dl/kolo/internal/reduce"
	"github.com/kolo-dl/kolo/internal/transport"
)

// AdasumAllreduce combines buf across the ranks of c with Adasum (Maleki et al., "Scaling
// Distributed Training with Adaptive Summation"), Horovod's op=hvd.Adasum, leaving the same bits on
// every rank. buf holds tensors of element type t back to back, counts[i] elements for tensor i
// (nil counts: buf is one tensor); the counts must add up to buf's elements and be the same on every
// rank. t must be a floating-point type: Adasum of integers is an error, as in Horovod.
//
// Two gradients a and b are combined as
//
//	adasum(a, b) = (1 - a·b / (2|a|²)) a + (1 - a·b / (2|b|²)) b
//
// separately for each tensor, with dot products and squared norms accumulated in float64. A side
// whose squared norm is below sqrt(DBL_MIN) keeps coefficient 1, as in Horovod, so a zero gradient
// leaves the other unchanged. adasum(a, a) = a; orthogonal a and b give a + b. float32 and float64
// combine in float64 and round once; float16 and bfloat16 are widened to float32 with reduce's
// converters, combined in float32 with the coefficients rounded to float32 (as Horovod's AVX path
// does) and rounded back.
//
// The ranks' gradients v_0..v_{n-1} are combined in a fixed binary tree. With p the largest power
// of two not above n, rank p+i (for i < n-p) is first folded into rank i: w_i = adasum(v_i,
// v_{p+i}), and w_i = v_i for the other i < p. Then level 1 combines (w_0, w_1), (w_2, w_3), ...,
// level 2 combines those results pairwise, and so on up to one vector: for n = 3 the result is
// adasum(adasum(v_0, v_2), v_1); for a power of two it is Horovod's tree exactly. Horovod refuses
// other rank counts.
//
// The power-of-two part is Horovod's recursive vector-halving, distance-doubling: at level k each
// rank swaps half of its current range with the rank whose number differs in bit k, computes the
// partial dot products and norms of each tensor on the half it keeps, and sums those partials with
// the 2^k ranks that hold the rest of the same two vectors (a recursive doubling of 3 float64 per
// tensor); every rank then combines its half, and a distance-halving allgather puts the halves back
// together. Like the ring, each of the p ranks sends and receives 2(p-1)/p of buf, here in
// 2 log2(p) steps (plus log2(p)(log2(p)+1)/2 small exchanges of partial sums), and it computes
// dot products and combinations on (p-1)/p of buf. A fold is one halving step of the same kind
// between ranks i and p+i, after which p+i sends its combined half to i, and gets the whole result
// back at the end.
//
// Every element of the result is computed by exactly one rank and then copied, and the ranks of a
// group get the same bits for their summed partials (pairwise float adds are commutative), so all
// ranks end bitwise identical. The received halves are kept in the part of buf each rank has just
// sent away, so that scratch stays one segment however large buf is. The kernels are scalar Go:
// about 1 ns per element each for the dot products and the combination on these machines, which
// makes Adasum 2-3 times slower than a sum allreduce over inmem.
func AdasumAllreduce(ctx context.Context, c transport.Comm, buf []byte, t dtype.DType, counts []int) error {
	if !t.Valid() {
		return fmt.Errorf("adasum allreduce: invalid dtype %v", t)
	}
	if !t.IsFloat() {
		return fmt.Errorf("adasum allreduce: dtype %v is not a floating-point type (Adasum combines float16, bfloat16, float32 or float64 gradients)", t)
	}
	es := t.Size()
	if len(buf)%es != 0 {
		return fmt.Errorf("adasum allreduce: %d-byte buffer is not a whole number of %v elements (%d bytes each)", len(buf), t, es)
	}
	total := len(buf) / es
	if counts != nil {
		sum := 0
		for i, k := range counts {
			if k < 0 {
				return fmt.Errorf("adasum allreduce: tensor %d has %d elements", i, k)
			}
			sum += k
		}
		if sum != total {
			return fmt.Errorf("adasum allreduce: tensors of %d elements in all, buffer holds %d %v elements", sum, total, t)
		}
	}
	n, r := c.Size(), c.Rank()
	if n == 1 || total == 0 {
		return nil
	}

	// Scratch: one exchange segment, the spill slot, two float32 chunks for halves, and the
	// partial sums (ours and a peer's) of every tensor.
	seg := min(segmentBytes, (total/2+1)*es)
	seg = (seg + 7) &^ 7
	a := adasum{c: c, buf: buf, t: t, es: es, counts: counts, total: total}
	nums := 3 * a.tensors() * 8
	ws := getWorkspace(seg+8+2*4*halfChunk+2*nums, 0)
	defer putWorkspace(ws)
	s := ws.buf
	a.scratch, s = s[:seg], s[seg:]
	a.spill, s = s[:es], s[8:]
	a.wa, s = floats[float32](s[:4*halfChunk]), s[4*halfChunk:]
	a.wb, s = floats[float32](s[:4*halfChunk]), s[4*halfChunk:]
	a.sums, a.peerSums = s[:nums], s[nums:2*nums]

	p := 1
	for p*2 <= n {
		p *= 2
	}
	if r >= p { // folded: combine with rank r-p, hand it our half, wait for the result
		peer := r - p
		h, err := a.fold(ctx, peer, false, total)
		if err != nil {
			return err
		}
		if err := c.Send(ctx, peer, buf[h.klo*es:h.khi*es]); err != nil {
			return fmt.Errorf("adasum allreduce: fold: send combined half to rank %d: %w", peer, err)
		}
		if err := c.Recv(ctx, peer, buf); err != nil {
			return fmt.Errorf("adasum allreduce: fold: recv result from rank %d: %w", peer, err)
		}
		return nil
	}
	if r+p < n { // fold rank r+p into ours
		peer := r + p
		h, err := a.fold(ctx, peer, true, total)
		if err != nil {
			return err
		}
		if err := c.Recv(ctx, peer, buf[h.khi*es:]); err != nil {
			return fmt.Errorf("adasum allreduce: fold: recv combined half from rank %d: %w", peer, err)
		}
	}

	// Vector halving, distance doubling among ranks 0..p-1.
	var ranges [64][2]int // [lo, hi) before each level
	lo, hi, levels := 0, total, 0
	for m := 1; m < p; m <<= 1 {
		ranges[levels] = [2]int{lo, hi}
		levels++
		h, err := a.halve(ctx, levels, r^m, r&m == 0, lo, hi)
		for mm := 1; mm <= m && err == nil; mm <<= 1 {
			err = a.sumWith(ctx, levels, r^mm)
		}
		if err != nil {
			return err
		}
		a.combine(h)
		lo, hi = h.klo, h.khi
	}
	// Distance halving allgather: the peer of each level holds the rest of that level's range.
	for l := levels - 1; l >= 0; l-- {
		peer := r ^ (1 << l)
		plo, phi := ranges[l][0], ranges[l][1]
		rlo, rhi := plo, lo
		if lo == plo {
			rlo, rhi = hi, phi
		}
		if err := c.SendRecv(ctx, peer, buf[lo*es:hi*es], peer, buf[rlo*es:rhi*es]); err != nil {
			return fmt.Errorf("adasum allreduce: allgather level %d of %d: exchange with rank %d: %w", l+1, levels, peer, err)
		}
		lo, hi = plo, phi
	}

	if r+p < n {
		if err := c.Send(ctx, r+p, buf); err != nil {
			return fmt.Errorf("adasum allreduce: fold: send result to rank %d: %w", r+p, err)
		}
	}
	return nil
}

// halfChunk is how many halves are widened to float32 at a time.
const halfChunk = 1024

// sqrtDBLMin is sqrt(DBL_MIN): a squared norm below it counts as zero (Horovod's guard).
const sqrtDBLMin = 0x1p-511

// adasum is one call's state.
type adasum struct {
	c      transport.Comm
	buf    []byte
	t      dtype.DType
	es     int
	counts []int // nil: one tensor of total elements
	total  int

	scratch []byte    // one exchange segment
	spill   []byte    // the received element that did not fit the freed half (one element)
	wa, wb  []float32 // halves widened, halfChunk each
	// sums and peerSums hold, per tensor, dot(a, b), |a|² and |b|² as float64 (a: the vector of
	// the lower half of the group, b: the upper).
	sums, peerSums []byte
}

func (a *adasum) tensors() int {
	if a.counts == nil {
		return 1
	}
	return len(a.counts)
}

// count is the number of elements of tensor i.
func (a *adasum) count(i int) int {
	if a.counts == nil {
		return a.total
	}
	return a.counts[i]
}

// halfRange says where a level's halves are: this rank keeps [klo, khi); the peer's copy of those
// elements is at [flo, flo+fn) of buf (the half this rank sent away) and, past fn, in spill.
type halfRange struct {
	klo, khi int
	flo, fn  int
	lower    bool // this rank holds a (the lower side's vector)
}

// stepName names a halving step in errors: level 0 is the fold.
func stepName(level int) string {
	if level == 0 {
		return "fold"
	}
	return fmt.Sprintf("level %d", level)
}

// halve swaps halves of [lo, hi) with peer: the lower side keeps the first floor(len/2) elements.
// The received half goes to the half just sent, segment by segment once each is sent, its last
// element to spill when it is the longer half.
func (a *adasum) halve(ctx context.Context, level, peer int, lower bool, lo, hi int) (halfRange, error) {
	mid := lo + (hi-lo)/2
	h := halfRange{klo: lo, khi: mid, flo: mid, fn: hi - mid, lower: lower}
	if !lower {
		h = halfRange{klo: mid, khi: hi, flo: lo, fn: mid - lo}
	}
	es := a.es
	out := a.buf[h.flo*es : (h.flo+h.fn)*es]
	inLen := (h.khi - h.klo) * es
	seg := len(a.scratch)
	for off := 0; off < len(out) || off < inLen; off += seg {
		sseg := segment(out, off, seg)
		tmp := a.scratch[:max(0, min(seg, inLen-off))]
		if err := a.c.SendRecv(ctx, peer, sseg, peer, tmp); err != nil {
			return h, fmt.Errorf("adasum allreduce: %s: exchange halves with rank %d: %w", stepName(level), peer, err)
		}
		k := copy(out[min(off, len(out)):], tmp)
		copy(a.spill, tmp[k:])
	}
	h.partials(a)
	return h, nil
}

// pieces returns tensor part [s, e) of the kept range and the peer's copy of it, cut in two where
// that copy continues in the spill slot.
func (h *halfRange) pieces(a *adasum, s, e int) (own1, oth1, own2, oth2 []byte) {
	es := a.es
	j0, j1 := s-h.klo, e-h.klo
	cut := min(max(j0, h.fn), j1)
	own1 = a.buf[s*es : (s+cut-j0)*es]
	oth1 = a.buf[(h.flo+j0)*es : (h.flo+cut)*es]
	own2 = a.buf[(s+cut-j0)*es : e*es]
	if cut < j1 {
		oth2 = a.spill[(cut-h.fn)*es : (j1-h.fn)*es]
	}
	return
}

// partials writes each tensor's dot product and squared norms over the kept range to sums.
func (h *halfRange) partials(a *adasum) {
	sums := floats[float64](a.sums)
	start := 0
	for i := range a.tensors() {
		k := a.count(i)
		s, e := max(start, h.klo), min(start+k, h.khi)
		start += k
		var dot, aa, bb float64
		if s < e {
			own1, oth1, own2, oth2 := h.pieces(a, s, e)
			d1, o1, p1 := a.dotNorms(own1, oth1)
			d2, o2, p2 := a.dotNorms(own2, oth2)
			dot, aa, bb = d1+d2, o1+o2, p1+p2
			if !h.lower {
				aa, bb = bb, aa
			}
		}
		sums[3*i], sums[3*i+1], sums[3*i+2] = dot, aa, bb
	}
}

// sumWith adds peer's partial sums to ours (a + b is commutative in IEEE arithmetic, so both sides
// get the same bits).
// fold is the first step of folding a rank past the largest power of 2 into its partner: the
// two exchange halves of the whole buffer (lower: this rank keeps the low half), agree on the
// per-tensor sums and combine their halves. It returns the half this rank combined.
func (a *adasum) fold(ctx context.Context, peer int, lower bool, total int) (halfRange, error) {
	h, err := a.halve(ctx, 0, peer, lower, 0, total)
	if err == nil {
		err = a.sumWith(ctx, 0, peer)
	}
	if err != nil {
		return h, err
	}
	a.combine(h)
	return h, nil
}

func (a *adasum) sumWith(ctx context.Context, level, peer int) error {
	if err := a.c.SendRecv(ctx, peer, a.sums, peer, a.peerSums); err != nil {
		return fmt.Errorf("adasum allreduce: %s: sum dot products with rank %d: %w", stepName(level), peer, err)
	}
	mine, theirs := floats[float64](a.sums), floats[float64](a.peerSums)
	for i := range mine {
		mine[i] += theirs[i]
	}
	return nil
}

// combine replaces each tensor's kept part with the Adasum of the two vectors, from the summed
// dot products and norms.
func (a *adasum) combine(h halfRange) {
	sums := floats[float64](a.sums)
	start := 0
	for i := range a.tensors() {
		k := a.count(i)
		s, e := max(start, h.klo), min(start+k, h.khi)
		start += k
		if s >= e {
			continue
		}
		dot, aa, bb := sums[3*i], sums[3*i+1], sums[3*i+2]
		ac, bc := 1.0, 1.0
		if aa >= sqrtDBLMin {
			ac = 1 - dot/aa*0.5
		}
		if bb >= sqrtDBLMin {
			bc = 1 - dot/bb*0.5
		}
		own1, oth1, own2, oth2 := h.pieces(a, s, e)
		if h.lower {
			a.scaledAdd(own1, own1, oth1, ac, bc)
			a.scaledAdd(own2, own2, oth2, ac, bc)
		} else {
			a.scaledAdd(own1, oth1, own1, ac, bc)
			a.scaledAdd(own2, oth2, own2, ac, bc)
		}
	}
}

// dotNorms returns x·y, |x|² and |y|², accumulated in float64.
func (a *adasum) dotNorms(x, y []byte) (dot, xx, yy float64) {
	switch a.t {
	case dtype.Float32:
		return dotNormsOf(floats[float32](x), floats[float32](y))
	case dtype.Float64:
		return dotNormsOf(floats[float64](x), floats[float64](y))
	}
	for off := 0; off < len(x); off += 2 * halfChunk {
		xs, ys := segment(x, off, 2*halfChunk), segment(y, off, 2*halfChunk)
		wx, wy := a.wa[:len(xs)/2], a.wb[:len(ys)/2]
		a.widen(wx, xs)
		a.widen(wy, ys)
		d, p, q := dotNormsOf(wx, wy)
		dot, xx, yy = dot+d, xx+p, yy+q
	}
	return dot, xx, yy
}

// dotNormsOf runs two chains of each sum. Scalar Go is bound by the float32-to-float64
// conversions and multiplies here, not by add latency: four chains measured no faster.
func dotNormsOf[T float32 | float64](x, y []T) (dot, xx, yy float64) {
	y = y[:len(x)]
	var d0, d1, x0, x1, y0, y1 float64
	i := 0
	for ; i+2 <= len(x); i += 2 {
		p, q := float64(x[i]), float64(x[i+1])
		u, v := float64(y[i]), float64(y[i+1])
		d0 += p * u
		d1 += q * v
		x0 += p * p
		x1 += q * q
		y0 += u * u
		y1 += v * v
	}
	if i < len(x) {
		p, u := float64(x[i]), float64(y[i])
		d0 += p * u
		x0 += p * p
		y0 += u * u
	}
	return d0 + d1, x0 + x1, y0 + y1
}

// scaledAdd sets dst = xc*x + yc*y elementwise; dst is x or y.
func (a *adasum) scaledAdd(dst, x, y []byte, xc, yc float64) {
	switch a.t {
	case dtype.Float32:
		d, xs, ys := floats[float32](dst), floats[float32](x), floats[float32](y)
		ys = ys[:len(xs)]
		for i := range xs {
			d[i] = float32(xc*float64(xs[i]) + yc*float64(ys[i]))
		}
		return
	case dtype.Float64:
		d, xs, ys := floats[float64](dst), floats[float64](x), floats[float64](y)
		ys = ys[:len(xs)]
		for i := range xs {
			d[i] = xc*xs[i] + yc*ys[i]
		}
		return
	}
	xf, yf := float32(xc), float32(yc)
	for off := 0; off < len(x); off += 2 * halfChunk {
		xs, ys := segment(x, off, 2*halfChunk), segment(y, off, 2*halfChunk)
		wx, wy := a.wa[:len(xs)/2], a.wb[:len(ys)/2]
		a.widen(wx, xs)
		a.widen(wy, ys)
		wy = wy[:len(wx)]
		for i := range wx {
			wx[i] = xf*wx[i] + yf*wy[i]
		}
		if a.t == dtype.Float16 {
			reduce.Float32ToFloat16(segment(dst, off, 2*halfChunk), wx)
		} else {
			reduce.Float32ToBFloat16(segment(dst, off, 2*halfChunk), wx)
		}
	}
}

func (a *adasum) widen(dst []float32, src []byte) {
	if a.t == dtype.Float16 {
		reduce.Float16ToFloat32(dst, src)
	} else {
		reduce.BFloat16ToFloat32(dst, src)
	}
}

// floats views b as elements of T (b is aligned: element offsets into buffers of T).
func floats[T float32 | float64](b []byte) []T {
	if len(b) == 0 {
		return nil
	}
	var z T
	return unsafe.Slice((*T)(unsafe.Pointer(&b[0])), len(b)/int(unsafe.Sizeof(z)))
}
