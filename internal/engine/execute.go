package engine

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"

	"github.com/kolo-dl/kolo/internal/collective"
	"github.com/kolo-dl/kolo/internal/dtype"
	"github.com/kolo-dl/kolo/internal/engine/negotiate"
	"github.com/kolo-dl/kolo/internal/reduce"
	"github.com/kolo-dl/kolo/internal/timeline"
	"github.com/kolo-dl/kolo/internal/transport"
)

// executor runs negotiated responses of one process set on this rank. The fusion buffer, allocated
// once and grown to the largest group seen, is shared by every set's executor (one runs at a time;
// fresh pages are slow to fault on these machines: never free it).
type executor struct {
	g      Group
	cfg    Config
	fusion *[]byte
	single bool     // every rank is on this host: use the host group (shared memory) for everything
	hosts  []string // every job rank's host (a process set's g.Hosts are by its own ranks)

	// Set by the engine around each run.
	tl  *timeline.Timeline // nil: not recording
	set int

	// Reused by every fused allreduce, so that running one allocates nothing of the executor's:
	// the byte size of each of the response's tensors, and the indices of those fused.
	sizes  []int64
	fused  []int
	counts []int             // element counts of the fused tensors, for Adasum
	tun    collective.Tuning // what the collectives run under; a Retune response changes it (engine.retune)
}

// newExecutor starts with cfg's hierarchical setting and the collectives' default thresholds; rank 0
// replaces them with its own by a Retune ahead of the first op where they can differ (engine New).
func newExecutor(g Group, cfg Config) *executor {
	return &executor{g: g, cfg: cfg, fusion: new([]byte), single: len(g.LocalRanks) == g.Size && g.Local != nil, hosts: g.Hosts,
		tun: collective.Tuning{SlotStores: cfg.SlotStores, SlotStoresMeasured: logSlotStores}}
}

// logSlotStores logs what a group's measurement of its slot stores found (KOLO_LOG_LEVEL=debug):
// package collective does not log.
func logSlotStores(m collective.SlotStoresMeasurement) {
	slog.Debug("collective: slot stores measured", "ranks", m.Ranks, "chosen", m.Chosen,
		"streaming", m.Streaming, "plain", m.Plain)
}

// sub is the executor of a process set over g (its own ranks and Comm; no host or cross groups, so
// only the message-passing algorithms), sharing x's fusion buffer.
func (x *executor) sub(g Group) *executor {
	return &executor{g: g, cfg: x.cfg, fusion: x.fusion, hosts: x.hosts, tun: x.tun}
}

// mark starts activity on r's tensors in the timeline, if one is recording.
func (x *executor) mark(r *negotiate.Response, activity string) {
	if x.tl != nil {
		x.tl.Activity(x.set, r.Names, activity)
	}
}

// comm is the group to run non-hierarchical collectives on.
func (x *executor) comm() transport.Comm {
	if x.single {
		return x.g.Local
	}
	return x.g.Comm
}

func (x *executor) buffer(n int) []byte {
	if cap(*x.fusion) < n {
		*x.fusion = make([]byte, n)
	}
	return (*x.fusion)[:n]
}

func elems(shape []int64) int64 {
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	return n
}

func rowElems(shape []int64) int64 {
	if len(shape) == 0 {
		return 1
	}
	return elems(shape[1:])
}

func (x *executor) run(ctx context.Context, r negotiate.Response, entries []*entry) error {
	var err error
	if x.tl != nil && r.Kind != negotiate.Allreduce && r.Kind != negotiate.Broadcast {
		x.mark(&r, collectiveLabel(r.Kind))
	}
	switch r.Kind {
	case negotiate.Allreduce:
		err = x.allreduce(ctx, r, entries)
	case negotiate.Broadcast:
		err = x.broadcast(ctx, r, entries)
	case negotiate.Allgather:
		for i := range r.Names {
			if err = x.allgather(ctx, r, i, entries[i]); err != nil {
				break
			}
		}
	case negotiate.Alltoall:
		for i := range r.Names {
			if err = x.alltoall(ctx, r, i, entries[i]); err != nil {
				break
			}
		}
	case negotiate.ReduceScatter:
		for i := range r.Names {
			if err = x.reducescatter(ctx, r, i, entries[i]); err != nil {
				break
			}
		}
	case negotiate.Barrier:
		err = collective.Barrier(ctx, x.comm())
	case negotiate.Join:
		// Completion only; the engine finishes the join handle.
	default:
		err = fmt.Errorf("unknown response kind %v", r.Kind)
	}
	if err != nil {
		var se *transport.StallError
		if errors.As(err, &se) {
			return x.stalled(r, err, se)
		}
		return fmt.Errorf("rank %d: %s %s: %w", x.g.Rank, r.Kind, quoteNames(r.Names), err)
	}
	return nil
}

// stallFailure is a collective that a progress deadline ended: the transport waited on a peer that
// moved nothing. Its message leads with that peer, then says where the collective was.
type stallFailure struct {
	msg   string
	stall transport.StallError // with the peer's host
}

func (f *stallFailure) Error() string { return f.msg }
func (f *stallFailure) Unwrap() error { return &f.stall }

// stalled words a collective's stall: `rank 0: allreduce "w": rank 1 (node1) made no progress for
// 1m0s (recv: 0 of 4096 bytes received), in ring allreduce: reduce-scatter step 1 of 1: ...`.
func (x *executor) stalled(r negotiate.Response, err error, se *transport.StallError) error {
	f := &stallFailure{stall: *se}
	if f.stall.Host == "" && f.stall.Rank >= 0 && f.stall.Rank < len(x.hosts) {
		f.stall.Host = x.hosts[f.stall.Rank] // transports name peers by job rank (Sub keeps them)
	}
	where := strings.TrimSuffix(strings.TrimSuffix(err.Error(), se.Error()), ": ")
	f.msg = fmt.Sprintf("rank %d: %s %s: %v", x.g.Rank, r.Kind, quoteNames(r.Names), &f.stall)
	if where != "" {
		f.msg += ", in " + where
	}
	return f
}

func quoteNames(names []string) string {
	if len(names) == 1 {
		return fmt.Sprintf("%q", names[0])
	}
	if len(names) > 4 {
		return fmt.Sprintf("%q and %d more (fused)", names[:4], len(names)-4)
	}
	return fmt.Sprintf("%q (fused)", names)
}

// tuning is what the config tells the collectives.
func (x *executor) tuning() *collective.Tuning { return &x.tun }

// reduceAll reduces buf across the group and multiplies the result by scale.
func (x *executor) reduceAll(ctx context.Context, buf []byte, t dtype.DType, op reduce.Op, scale float64) error {
	switch {
	case x.g.Size == 1:
		if scale != 1 {
			reduce.Scale(t, buf, scale)
		}
		return nil
	case x.cfg.Hierarchical && x.g.Cross != nil && x.g.Local != nil && x.g.Local.Size() > 1 && !x.single:
		return collective.HierarchicalAllreduceScaled(ctx, x.g.Local, x.g.Cross, buf, t, op, scale, x.tuning())
	}
	return collective.AllreduceScaled(ctx, x.comm(), buf, t, op, scale, x.tuning())
}

// preScale is the factor r's data is multiplied by before the reduction (1: none).
func preScale(r negotiate.Response) float64 {
	f := r.PreScale
	if f == 0 {
		f = 1
	}
	return deviceFactor(f, r.DType, r.GPU)
}

// postScale is the factor r's result is multiplied by (1: none): its postscale, divided by the
// group's size for an average, as Horovod folds an average into the postscale.
func postScale(r negotiate.Response, size int) float64 {
	f := r.PostScale
	if f == 0 {
		f = 1
	}
	if r.Average {
		f /= float64(size)
	}
	return deviceFactor(f, r.DType, r.GPU)
}

// deviceFactor is scale factor f as applied to a tensor of dtype t. Horovod's CUDA kernels round a
// float16 tensor's factor to float16 and multiply in float16 (__hmul), where its CPU code (and
// kolo's kernels) multiply in float32: the product of two float16s is exact in float32, so with
// the factor rounded first reduce.Scale rounds once, to the same float16 as the GPU. Only GPU
// tensors get this, so that a script gives the results it gave under Horovod on either device.
func deviceFactor(f float64, t dtype.DType, gpu bool) float64 {
	if !gpu || t != dtype.Float16 || f == 1 {
		return f
	}
	return float64(reduce.Float16BitsToFloat32(reduce.Float32ToFloat16Bits(float32(f))))
}

// unfusedBytes: a tensor at least this large is reduced in place, on its own, even when its
// response fuses it with others. Fusion amortises per-op latency, which a tensor this size does not
// feel (each collective call costs microseconds), while copying it into the fusion buffer and back
// costs two more passes over memory: for a 23 MB MLP's gradients at 2 ranks, 4.5 ms of a ~9 ms
// step of allreduces. The choice depends on the response's shapes only, so every rank makes it.
const unfusedBytes = 1 << 20

func (x *executor) allreduce(ctx context.Context, r negotiate.Response, entries []*entry) error {
	t := r.DType
	es := int64(t.Size())
	if r.ReduceOp == negotiate.ReduceAdasum && len(r.Joined) > 0 { // negotiation refuses it first
		return fmt.Errorf("Adasum is not supported with join")
	}
	if len(entries) == 1 && entries[0] != nil {
		x.mark(&r, collectiveLabel(r.Kind))
		return x.reduceInPlace(ctx, r, entries[0])
	}
	sizes, fused := x.sizes[:0], x.fused[:0] // fused: the tensors that go through the fusion buffer
	var total int64
	for i, shape := range r.Shapes {
		n := elems(shape) * es
		sizes = append(sizes, n)
		if n < unfusedBytes {
			fused = append(fused, i)
			total += n
		}
	}
	x.sizes, x.fused = sizes, fused
	if len(fused) < len(entries) {
		x.mark(&r, collectiveLabel(r.Kind))
		for i, en := range entries {
			n := sizes[i]
			if n < unfusedBytes {
				continue
			}
			var err error
			if en != nil {
				err = x.reduceInPlace(ctx, r, en)
			} else { // this rank joined: contribute nothing, from scratch
				buf := x.buffer(int(n))
				fillIdentity(buf, t, reduce.Op(r.ReduceOp))
				err = x.reduceScaled(ctx, r, buf, nil)
			}
			if err != nil {
				return err
			}
		}
	}
	if len(fused) == 0 {
		return nil
	}
	buf := x.buffer(int(total))
	x.mark(&r, memcpyIn)
	off := int64(0)
	for _, i := range fused {
		n := sizes[i]
		if en := entries[i]; en != nil {
			copy(buf[off:off+n], en.in)
		} else {
			fillIdentity(buf[off:off+n], t, reduce.Op(r.ReduceOp)) // this rank joined: contribute nothing
		}
		off += n
	}
	var counts []int // Adasum combines each tensor on its own
	if r.ReduceOp == negotiate.ReduceAdasum {
		counts = x.counts[:0]
		for _, i := range fused {
			counts = append(counts, int(sizes[i]/es))
		}
		x.counts = counts
	}
	x.mark(&r, collectiveLabel(r.Kind))
	if err := x.reduceScaled(ctx, r, buf, counts); err != nil {
		return err
	}
	x.mark(&r, memcpyOut)
	off = 0
	for _, i := range fused {
		n := sizes[i]
		if en := entries[i]; en != nil {
			copy(en.out, buf[off:off+n])
		}
		off += n
	}
	return nil
}

// reduceInPlace reduces one tensor in its output buffer, without the fusion buffer.
func (x *executor) reduceInPlace(ctx context.Context, r negotiate.Response, en *entry) error {
	if len(en.in) > 0 && &en.in[0] != &en.out[0] {
		copy(en.out, en.in)
	}
	return x.reduceScaled(ctx, r, en.out, nil)
}

// reduceScaled applies r's prescale, reduces buf across the group, and applies r's postscale (and
// the division of an average). For Adasum, buf holds tensors of counts elements (nil: one tensor).
func (x *executor) reduceScaled(ctx context.Context, r negotiate.Response, buf []byte, counts []int) error {
	t, op := r.DType, reduce.Op(r.ReduceOp)
	if f := preScale(r); f != 1 {
		reduce.Scale(t, buf, f)
	}
	if r.ReduceOp == negotiate.ReduceAdasum {
		return x.adasum(ctx, buf, t, counts, postScale(r, x.g.Size))
	}
	return x.reduceAll(ctx, buf, t, op, postScale(r, x.g.Size))
}

// adasum combines buf's tensors across the group with Adasum, then multiplies the result by scale
// (Horovod scales before and after Adasum, never inside it). It runs the message-passing algorithm
// over the Comm of all the set's ranks: Adasum has no hierarchical or shared-memory variant, and a
// process set's executor has its own Comm, so it works in any set.
func (x *executor) adasum(ctx context.Context, buf []byte, t dtype.DType, counts []int, scale float64) error {
	if x.g.Size > 1 {
		if err := collective.AdasumAllreduce(ctx, x.comm(), buf, t, counts); err != nil {
			return err
		}
	}
	if scale != 1 {
		reduce.Scale(t, buf, scale)
	}
	return nil
}

func (x *executor) broadcast(ctx context.Context, r negotiate.Response, entries []*entry) error {
	es := int64(r.DType.Size())
	root := x.g.Rank == r.Root
	if len(entries) == 1 && entries[0] != nil {
		x.mark(&r, collectiveLabel(r.Kind))
		en := entries[0]
		if root && len(en.in) > 0 && &en.in[0] != &en.out[0] {
			copy(en.out, en.in)
		}
		if x.g.Size == 1 {
			return nil
		}
		return collective.Broadcast(ctx, x.comm(), en.out, r.Root, x.tuning())
	}
	var total int64
	for _, s := range r.Shapes {
		total += elems(s) * es
	}
	buf := x.buffer(int(total))
	x.mark(&r, memcpyIn)
	if root {
		off := int64(0)
		for i, en := range entries {
			n := elems(r.Shapes[i]) * es
			copy(buf[off:off+n], en.in)
			off += n
		}
	}
	x.mark(&r, collectiveLabel(r.Kind))
	if x.g.Size > 1 {
		if err := collective.Broadcast(ctx, x.comm(), buf, r.Root, x.tuning()); err != nil {
			return err
		}
	}
	x.mark(&r, memcpyOut)
	off := int64(0)
	for i, en := range entries {
		n := elems(r.Shapes[i]) * es
		if en != nil {
			copy(en.out, buf[off:off+n])
		}
		off += n
	}
	return nil
}

func (x *executor) allgather(ctx context.Context, r negotiate.Response, i int, en *entry) error {
	rb := rowElems(r.Shapes[i]) * int64(r.DType.Size())
	counts := make([]int, x.g.Size)
	total := 0
	for rank, rows := range r.Dim0[i] {
		counts[rank] = int(rows * rb)
		total += counts[rank]
	}
	out := make([]byte, total)
	var send []byte
	if en != nil {
		send = en.in
	}
	if len(send) != counts[x.g.Rank] {
		return fmt.Errorf("input has %d bytes, negotiation expected %d", len(send), counts[x.g.Rank])
	}
	if x.g.Size == 1 {
		copy(out, send)
	} else if err := collective.Allgather(ctx, x.comm(), send, out, counts, x.tuning()); err != nil {
		return err
	}
	if en != nil {
		en.h.output = out
		en.h.rows = r.Shapes[i][0]
	}
	return nil
}

func (x *executor) alltoall(ctx context.Context, r negotiate.Response, i int, en *entry) error {
	rb := rowElems(r.Shapes[i]) * int64(r.DType.Size())
	n, me := x.g.Size, x.g.Rank
	sendCounts := make([]int, n)
	recvCounts := make([]int, n)
	recvRows := make([]int64, n)
	total := 0
	for p := 0; p < n; p++ {
		sendCounts[p] = int(r.Splits[me][p] * rb)
		recvRows[p] = r.Splits[p][me]
		recvCounts[p] = int(recvRows[p] * rb)
		total += recvCounts[p]
	}
	out := make([]byte, total)
	var send []byte
	if en != nil {
		send = en.in
	}
	if x.g.Size == 1 {
		copy(out, send)
	} else if err := collective.Alltoall(ctx, x.comm(), send, sendCounts, out, recvCounts, x.tuning()); err != nil {
		return err
	}
	if en != nil {
		en.h.output = out
		en.h.recvSplits = recvRows
		for _, n := range recvRows {
			en.h.rows += n
		}
	}
	return nil
}

// ShareRows is how Horovod splits dim 0 for reducescatter: ranks below d0 % n get one extra row.
func ShareRows(d0 int64, n int) []int64 {
	rows := make([]int64, n)
	for r := range rows {
		rows[r] = d0 / int64(n)
		if int64(r) < d0%int64(n) {
			rows[r]++
		}
	}
	return rows
}

func (x *executor) reducescatter(ctx context.Context, r negotiate.Response, i int, en *entry) error {
	t, op := r.DType, reduce.Op(r.ReduceOp)
	es := int64(t.Size())
	shape := r.Shapes[i]
	rb := rowElems(shape) * es
	rows := ShareRows(shape[0], x.g.Size)
	counts := make([]int, x.g.Size)
	for p, n := range rows {
		counts[p] = int(n * rb)
	}
	send := x.buffer(int(elems(shape) * es))
	if en != nil {
		copy(send, en.in) // never scale or reduce into the caller's input
	} else {
		fillIdentity(send, t, op)
	}
	if f := preScale(r); f != 1 {
		reduce.Scale(t, send, f)
	}
	out := make([]byte, counts[x.g.Rank])
	if x.g.Size == 1 {
		copy(out, send)
	} else if err := collective.ReduceScatter(ctx, x.comm(), send, out, counts, t, op, x.tuning()); err != nil {
		return err
	}
	if f := postScale(r, x.g.Size); f != 1 {
		reduce.Scale(t, out, f)
	}
	if en != nil {
		en.h.output = out
		en.h.rows = rows[x.g.Rank]
	}
	return nil
}

// fillIdentity fills buf with op's identity so a joined rank changes nothing: 0 for sum, 1 for
// product, the type's largest value for min and its smallest for max.
func fillIdentity(buf []byte, t dtype.DType, op reduce.Op) {
	if op == reduce.Sum || len(buf) == 0 {
		clear(buf)
		return
	}
	one := identity(t, op)
	for i := 0; i < len(buf); i += len(one) {
		copy(buf[i:], one)
	}
}

func identity(t dtype.DType, op reduce.Op) []byte {
	b := make([]byte, t.Size())
	le := binary.LittleEndian
	switch t {
	case dtype.Uint8:
		b[0] = map[reduce.Op]byte{reduce.Prod: 1, reduce.Min: 0xff, reduce.Max: 0}[op]
	case dtype.Int8:
		b[0] = byte(map[reduce.Op]int8{reduce.Prod: 1, reduce.Min: math.MaxInt8, reduce.Max: math.MinInt8}[op])
	case dtype.Int16:
		le.PutUint16(b, uint16(map[reduce.Op]int16{reduce.Prod: 1, reduce.Min: math.MaxInt16, reduce.Max: math.MinInt16}[op]))
	case dtype.Int32:
		le.PutUint32(b, uint32(map[reduce.Op]int32{reduce.Prod: 1, reduce.Min: math.MaxInt32, reduce.Max: math.MinInt32}[op]))
	case dtype.Int64:
		le.PutUint64(b, uint64(map[reduce.Op]int64{reduce.Prod: 1, reduce.Min: math.MaxInt64, reduce.Max: math.MinInt64}[op]))
	case dtype.Float32:
		le.PutUint32(b, math.Float32bits(float32(floatIdentity(op))))
	case dtype.Float64:
		le.PutUint64(b, math.Float64bits(floatIdentity(op)))
	case dtype.Float16:
		le.PutUint16(b, map[reduce.Op]uint16{reduce.Prod: 0x3c00, reduce.Min: 0x7c00, reduce.Max: 0xfc00}[op])
	case dtype.BFloat16:
		le.PutUint16(b, map[reduce.Op]uint16{reduce.Prod: 0x3f80, reduce.Min: 0x7f80, reduce.Max: 0xff80}[op])
	}
	return b
}

func floatIdentity(op reduce.Op) float64 {
	switch op {
	case reduce.Prod:
		return 1
	case reduce.Min:
		return math.Inf(1)
	case reduce.Max:
		return math.Inf(-1)
	}
	return 0
}
