package fake

import (
	"fmt"
	"slices"
)

// execute runs one unit of work of every rank (parts[r] is rank r's operations, in call order):
// collectives pair up by position among each rank's collectives, sends with receives by
// (sender, receiver) and order. Every input is read before any output is written, so buffers may
// alias (in-place collectives). NCCL does not check that ranks agree; a mismatch there corrupts or
// hangs, so here it is an error, which the engine's negotiation must make impossible.
func execute(parts [][]op) error {
	n := len(parts)
	var colls [][]op
	for r := range n {
		var cs []op
		for _, o := range parts[r] {
			if o.kind != opSend && o.kind != opRecv {
				cs = append(cs, o)
			}
		}
		colls = append(colls, cs)
	}
	for r := 1; r < n; r++ {
		if len(colls[r]) != len(colls[0]) {
			return fmt.Errorf("rank %d launched %d collectives together, rank 0 %d", r, len(colls[r]), len(colls[0]))
		}
	}
	type write struct {
		dst, src []byte
	}
	var writes []write
	for i := range colls[0] {
		ops := make([]op, n)
		for r := range n {
			ops[r] = colls[r][i]
			if a, b := ops[r], ops[0]; a.kind != b.kind || a.count != b.count || a.t != b.t || a.red != b.red || a.peer != b.peer {
				return fmt.Errorf("rank %d launched %v where rank 0 launched %v", r, a, b)
			}
		}
		ws, err := collective(ops)
		if err != nil {
			return err
		}
		for r, w := range ws {
			writes = append(writes, write{ops[r].recv, w})
		}
	}
	// Point to point: the k-th send from s to d meets the k-th receive at d from s.
	type edge struct{ from, to int }
	sends, recvs := map[edge][]op{}, map[edge][]op{}
	for r := range n {
		for _, o := range parts[r] {
			switch o.kind {
			case opSend:
				sends[edge{r, o.peer}] = append(sends[edge{r, o.peer}], o)
			case opRecv:
				recvs[edge{o.peer, r}] = append(recvs[edge{o.peer, r}], o)
			}
		}
	}
	for e, ss := range sends {
		rs := recvs[e]
		if len(rs) != len(ss) {
			return fmt.Errorf("rank %d sent %d messages to rank %d, which posted %d receives", e.from, len(ss), e.to, len(rs))
		}
		for k := range ss {
			if len(ss[k].send) != len(rs[k].recv) {
				return fmt.Errorf("message %d from rank %d to rank %d: %d bytes sent, %d expected", k, e.from, e.to, len(ss[k].send), len(rs[k].recv))
			}
			writes = append(writes, write{rs[k].recv, slices.Clone(ss[k].send)})
		}
	}
	for e, rs := range recvs {
		if len(sends[e]) != len(rs) {
			return fmt.Errorf("rank %d posted %d receives from rank %d, which sent %d", e.to, len(rs), e.from, len(sends[e]))
		}
	}
	for _, w := range writes {
		copy(w.dst, w.src)
	}
	return nil
}

// collective computes every rank's output of one collective (ops[r] is rank r's call), reading
// only inputs: the result for rank r is to be copied into ops[r].recv.
func collective(ops []op) ([][]byte, error) {
	n := len(ops)
	o := ops[0]
	size := o.t.Size()
	out := make([][]byte, n)
	switch o.kind {
	case opAllReduce:
		srcs := make([][]byte, n)
		for r := range n {
			srcs[r] = ops[r].send
		}
		res := make([]byte, o.count*size)
		reduceInto(o.t, o.red, res, srcs)
		for r := range n {
			out[r] = res
		}
	case opReduceScatter:
		srcs := make([][]byte, n)
		for r := range n {
			srcs[r] = ops[r].send
		}
		res := make([]byte, n*o.count*size)
		reduceInto(o.t, o.red, res, srcs)
		block := o.count * size
		for r := range n {
			out[r] = res[r*block : (r+1)*block]
		}
	case opAllGather:
		res := make([]byte, 0, n*o.count*size)
		for r := range n {
			res = append(res, ops[r].send...)
		}
		for r := range n {
			out[r] = res
		}
	case opBroadcast:
		res := slices.Clone(ops[o.peer].send)
		for r := range n {
			out[r] = res
		}
	default:
		return nil, fmt.Errorf("collective %v", o)
	}
	return out, nil
}
