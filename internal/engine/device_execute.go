package engine

import (
	"errors"
	"fmt"
	"time"

	"github.com/kolo-dl/kolo/internal/engine/negotiate"
	"github.com/kolo-dl/kolo/internal/gpu"
)

// runDevice enqueues response r of process set ps on the engine's stream: wait for each tensor's
// producer, fuse, run the collective on the set's communicator, copy out, record the done event.
// It returns when the work is enqueued, not run. Its error stops the engine, as a failed host
// collective does: an enqueue the library refused leaves the peers inside the collective.
func (e *Engine) runDevice(ps *procSet, r *negotiate.Response, entries []*entry) error {
	d := e.dev
	fail := func(err error) error {
		return fmt.Errorf("rank %d: device %s %s: %w", e.g.Rank, r.Kind, quoteNames(r.Names), err)
	}
	c := ps.dcomm
	if c == nil {
		return fail(fmt.Errorf("process set %d has no device communicator: %w", ps.id, ps.dcommErr))
	}
	for i, en := range entries {
		if en == nil {
			continue
		}
		if en.dev == nil {
			return fail(fmt.Errorf("%q was submitted in host memory, which the device path serves: submit it with EnqueueDevice", r.Names[i]))
		}
		if err := d.stream.WaitEvent(en.dev.ready); err != nil {
			return fail(fmt.Errorf("waiting for the producer of %q: %w", r.Names[i], err))
		}
		d.recycle(en.dev.ready)
	}
	t, err := gpu.FromDType(r.DType)
	if err != nil {
		return fail(err)
	}
	x := deviceRun{e: e, d: d, c: c, s: d.stream, t: t, es: r.DType.Size()}
	var outs []*deviceResult // per entry; nil where the engine allocated nothing
	switch r.Kind {
	case negotiate.Allreduce:
		err = x.allreduce(r, entries)
	case negotiate.Broadcast:
		err = x.broadcast(r, entries)
	case negotiate.Allgather, negotiate.Alltoall, negotiate.ReduceScatter:
		outs = make([]*deviceResult, len(entries))
		for i := range entries {
			var res *deviceResult
			switch r.Kind {
			case negotiate.Allgather:
				res, err = x.allgather(r, i, entries[i])
			case negotiate.Alltoall:
				res, err = x.alltoall(r, i, entries[i])
			default:
				res, err = x.reducescatter(r, i, entries[i])
			}
			outs[i] = res
			if err != nil {
				break
			}
		}
	default:
		err = fmt.Errorf("no device form of %s", r.Kind)
	}
	if err == nil {
		err = c.AsyncError()
	}
	var done gpu.Event
	if err == nil {
		if done, err = d.event(); err == nil {
			err = d.stream.Record(done)
		}
	}
	if err != nil {
		for _, res := range outs {
			if res != nil && res.out != 0 {
				_ = d.dev.Free(res.out) // nothing reads it: the engine stops and aborts the stream's communicator
			}
		}
		return fail(err)
	}
	w := &deviceWork{done: done, since: time.Now(), what: fmt.Sprintf("%s %s", r.Kind, quoteNames(r.Names))}
	for i, en := range entries {
		if en == nil {
			continue
		}
		res := &deviceResult{d: d, done: done}
		if outs != nil && outs[i] != nil {
			res = outs[i]
			res.done = done
		}
		en.h.dev = res
		w.results = append(w.results, res)
	}
	d.wmu.Lock()
	d.inflight = append(d.inflight, w)
	d.wmu.Unlock()
	return nil
}

// deviceRun is one response's device work.
type deviceRun struct {
	e  *Engine
	d  *devicePath
	c  gpu.Comm
	s  gpu.Stream
	t  gpu.DataType
	es int
}

// fusionBuffer is the device's fusion buffer, grown to n bytes. An outgrown buffer is kept until
// shutdown: work queued on the stream may still read it, and growth is rare.
func (x *deviceRun) fusionBuffer(n int) (gpu.Ptr, error) {
	d := x.d
	if d.fusionCap >= n && d.fusion != 0 {
		return d.fusion, nil
	}
	p, err := d.dev.Alloc(n)
	if err != nil {
		return 0, fmt.Errorf("fusion buffer of %d bytes: %w", n, err)
	}
	if d.fusion != 0 {
		d.retired = append(d.retired, d.fusion)
	}
	d.fusion, d.fusionCap = p, n
	return p, nil
}

// redOp is r's NCCL reduction. An average is NCCL's Avg (see EnqueueDevice).
func redOp(r *negotiate.Response) (gpu.RedOp, error) {
	if r.Average {
		return gpu.Avg, nil
	}
	switch r.ReduceOp {
	case negotiate.ReduceSum:
		return gpu.Sum, nil
	case negotiate.ReduceMin:
		return gpu.Min, nil
	case negotiate.ReduceMax:
		return gpu.Max, nil
	case negotiate.ReduceProd:
		return gpu.Prod, nil
	}
	return 0, fmt.Errorf("reduction %s has no device form", negotiate.ReduceOpName(r.ReduceOp, false))
}

// errJoined: a rank that joined has no device tensor to contribute, and filling one with the
// reduction's identity needs a kernel or a host copy the device layer does not have.
var errJoined = errors.New("ranks that joined cannot take part in ops on GPU tensors")

func (x *deviceRun) allreduce(r *negotiate.Response, entries []*entry) error {
	op, err := redOp(r)
	if err != nil {
		return err
	}
	if len(entries) == 1 {
		en := entries[0]
		return x.c.AllReduce(en.dev.op.In, en.dev.op.Out, en.dev.op.Bytes/x.es, x.t, op, x.s)
	}
	total := 0
	for _, en := range entries {
		total += en.dev.op.Bytes
	}
	buf, err := x.fusionBuffer(total)
	if err != nil {
		return err
	}
	off := 0
	for _, en := range entries {
		if err := x.s.CopyAsync(buf.Add(off), en.dev.op.In, en.dev.op.Bytes); err != nil {
			return err
		}
		off += en.dev.op.Bytes
	}
	if err := x.c.AllReduce(buf, buf, total/x.es, x.t, op, x.s); err != nil {
		return err
	}
	off = 0
	for _, en := range entries {
		if err := x.s.CopyAsync(en.dev.op.Out, buf.Add(off), en.dev.op.Bytes); err != nil {
			return err
		}
		off += en.dev.op.Bytes
	}
	return nil
}

func (x *deviceRun) broadcast(r *negotiate.Response, entries []*entry) error {
	root := x.c.Rank() == r.Root
	if len(entries) == 1 {
		op := entries[0].dev.op
		return x.c.Broadcast(op.In, op.Out, op.Bytes/x.es, x.t, r.Root, x.s)
	}
	total := 0
	for i := range entries {
		total += int(elems(r.Shapes[i])) * x.es
	}
	buf, err := x.fusionBuffer(total)
	if err != nil {
		return err
	}
	if root {
		off := 0
		for _, en := range entries {
			if err := x.s.CopyAsync(buf.Add(off), en.dev.op.In, en.dev.op.Bytes); err != nil {
				return err
			}
			off += en.dev.op.Bytes
		}
	}
	if err := x.c.Broadcast(buf, buf, total/x.es, x.t, r.Root, x.s); err != nil {
		return err
	}
	off := 0
	for _, en := range entries {
		if err := x.s.CopyAsync(en.dev.op.Out, buf.Add(off), en.dev.op.Bytes); err != nil {
			return err
		}
		off += en.dev.op.Bytes
	}
	return nil
}

// alloc is engine-allocated result memory of n bytes.
func (x *deviceRun) alloc(n int) (*deviceResult, error) {
	p, err := x.d.dev.Alloc(n)
	if err != nil {
		return nil, fmt.Errorf("result of %d bytes: %w", n, err)
	}
	return &deviceResult{d: x.d, out: p, n: n}, nil
}

// allgather gathers ragged first dimensions. Equal counts are one AllGather. Unequal ones are a
// group of broadcasts, one per rank into its place of the result, rather than one AllGather of
// inputs padded to the largest: NCCL runs a group as one launch, the broadcasts move exactly the
// bytes there are, write the result in place (padding needs a gathered buffer of n times the
// largest input and a copy per rank to close the gaps), and NCCL's documentation gives this form
// for allgatherv.
func (x *deviceRun) allgather(r *negotiate.Response, i int, en *entry) (*deviceResult, error) {
	rb := int(rowElems(r.Shapes[i])) * x.es
	n := x.c.Size()
	counts := make([]int, n)
	total, equal := 0, true
	for rank, rows := range r.Dim0[i] {
		counts[rank] = int(rows) * rb
		total += counts[rank]
		equal = equal && counts[rank] == counts[0]
	}
	if en.dev.op.Bytes != counts[x.c.Rank()] {
		return nil, fmt.Errorf("input has %d bytes, negotiation expected %d", en.dev.op.Bytes, counts[x.c.Rank()])
	}
	res, err := x.alloc(total)
	if err != nil {
		return nil, err
	}
	en.h.rows = r.Shapes[i][0]
	if equal {
		return res, x.c.AllGather(en.dev.op.In, res.out, counts[0]/x.es, x.t, x.s)
	}
	return res, gpu.Group(x.c, func() error {
		var first error
		off := 0
		for p := range n {
			if counts[p] > 0 {
				if err := x.c.Broadcast(en.dev.op.In, res.out.Add(off), counts[p]/x.es, x.t, p, x.s); err != nil && first == nil {
					first = fmt.Errorf("broadcast of rank %d's rows: %w", p, err)
				}
			}
			off += counts[p]
		}
		return first
	})
}

func (x *deviceRun) alltoall(r *negotiate.Response, i int, en *entry) (*deviceResult, error) {
	re := int(rowElems(r.Shapes[i]))
	n, me := x.c.Size(), x.c.Rank()
	sendCounts, sendDispls := make([]int, n), make([]int, n)
	recvCounts, recvDispls := make([]int, n), make([]int, n)
	recvRows := make([]int64, n)
	sent, total := 0, 0
	for p := range n {
		sendCounts[p], sendDispls[p] = int(r.Splits[me][p])*re, sent
		sent += sendCounts[p]
		recvRows[p] = r.Splits[p][me]
		recvCounts[p], recvDispls[p] = int(recvRows[p])*re, total
		total += recvCounts[p]
	}
	res, err := x.alloc(total * x.es)
	if err != nil {
		return nil, err
	}
	en.h.recvSplits = recvRows
	en.h.rows = 0
	for _, k := range recvRows {
		en.h.rows += k
	}
	return res, gpu.AllToAll(x.c, en.dev.op.In, sendCounts, sendDispls, res.out, recvCounts, recvDispls, x.t, x.s)
}

// reducescatter splits dim 0 as the host path does (ShareRows: the first d0 % n ranks get a row
// more). Equal blocks are one ReduceScatter; unequal ones are padded to the largest in the fusion
// buffer (each rank's rows at the start of its block; the padding's reduction is never read) and
// reduced there.
func (x *deviceRun) reducescatter(r *negotiate.Response, i int, en *entry) (*deviceResult, error) {
	op, err := redOp(r)
	if err != nil {
		return nil, err
	}
	shape := r.Shapes[i]
	rb := int(rowElems(shape)) * x.es
	n, me := x.c.Size(), x.c.Rank()
	rows := ShareRows(shape[0], n)
	res, err := x.alloc(int(rows[me]) * rb)
	if err != nil {
		return nil, err
	}
	en.h.rows = rows[me]
	block := int(rows[0]) * rb // the largest
	if int(rows[n-1])*rb == block {
		return res, x.c.ReduceScatter(en.dev.op.In, res.out, block/x.es, x.t, op, x.s)
	}
	buf, err := x.fusionBuffer((n + 1) * block)
	if err != nil {
		return res, err
	}
	off := 0
	for p := range n {
		k := int(rows[p]) * rb
		if err := x.s.CopyAsync(buf.Add(p*block), en.dev.op.In.Add(off), k); err != nil {
			return res, err
		}
		off += k
	}
	mine := buf.Add(n * block)
	if err := x.c.ReduceScatter(buf, mine, block/x.es, x.t, op, x.s); err != nil {
		return res, err
	}
	return res, x.s.CopyAsync(res.out, mine, res.n)
}
