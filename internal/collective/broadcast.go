package collective

import (
	"context"
	"fmt"

	"github.com/kolo-dl/kolo/internal/transport"
)

// Broadcast copies root's buf into every other rank's buf. Small buffers go down a binomial tree
// (ceil(log2 n) rounds, the latency optimum); large ones down a pipelined chain root -> root+1 ->
// ... in segments, so that every link is busy at once and the time approaches one buffer transfer
// plus n-2 segment transfers. Over shared memory among more than two ranks, from 1 MiB, it goes through root's
// slot (sharedBroadcast), where every rank copies each piece out at once while root writes the
// next; between two, the chain is one ring, which pipelines finer.
func Broadcast(ctx context.Context, c transport.Comm, buf []byte, root int, tun *Tuning) error {
	n := c.Size()
	if root < 0 || root >= n {
		return fmt.Errorf("broadcast: root %d outside [0,%d)", root, n)
	}
	if n == 1 || len(buf) == 0 {
		return nil
	}
	if len(buf) < tun.smallBroadcast() {
		return binomialBroadcast(ctx, c, buf, root)
	}
	if s, ok := sharedOf(c, 128); ok && n > 2 && len(buf) >= sharedBroadcastBytes && !tun.noShared() {
		return sharedBroadcast(ctx, c, s, buf, root, tun)
	}
	return chainBroadcast(ctx, c, buf, root)
}

// sharedBroadcastBytes is where broadcast through the slots starts: its two barriers cost more than
// the chain's segment hops below it. 8 ranks on 2 CPUs (BenchmarkExchanges): 256 KiB took 0.99 ms
// through the slots against 0.40 ms down the chain, 4 MiB 1.7 ms against 3.2.
const sharedBroadcastBytes = 1 << 20

// binomialBroadcast: in virtual ranks v = rank-root, v receives from v minus its lowest set bit,
// then sends to v+2^k for every 2^k below that bit, largest first (the subtrees that take longest).
func binomialBroadcast(ctx context.Context, c transport.Comm, buf []byte, root int) error {
	n, r := c.Size(), c.Rank()
	v := mod(r-root, n)
	mask := 1
	for mask < n {
		if v&mask != 0 {
			parent := mod(v-mask+root, n)
			if err := c.Recv(ctx, parent, buf); err != nil {
				return fmt.Errorf("broadcast from rank %d: binomial tree: recv from parent rank %d: %w", root, parent, err)
			}
			break
		}
		mask <<= 1
	}
	for mask >>= 1; mask > 0; mask >>= 1 {
		if v+mask < n {
			child := mod(v+mask+root, n)
			if err := c.Send(ctx, child, buf); err != nil {
				return fmt.Errorf("broadcast from rank %d: binomial tree: send to child rank %d: %w", root, child, err)
			}
		}
	}
	return nil
}

// chainSegment picks the pipeline segment for a chain broadcast of nbytes: about 1/16 of the
// buffer, so the n-2 extra segment times stay small next to the whole, within [16 KiB, 512 KiB].
// Every rank computes the same value.
func chainSegment(nbytes int) int {
	return min(max(nbytes/16, 16<<10), 512<<10)
}

// chainBroadcast forwards segment k to the next rank while receiving segment k+1 from the
// previous one.
func chainBroadcast(ctx context.Context, c transport.Comm, buf []byte, root int) error {
	n, r := c.Size(), c.Rank()
	v := mod(r-root, n)
	prev, next := mod(r-1, n), mod(r+1, n)
	seg := chainSegment(len(buf))
	segs := (len(buf) + seg - 1) / seg
	fail := func(k int, what string, peer int, err error) error {
		return fmt.Errorf("broadcast from rank %d: chain: segment %d of %d: %s rank %d: %w", root, k+1, segs, what, peer, err)
	}
	switch {
	case v == 0:
		for k := range segs {
			if err := c.Send(ctx, next, segment(buf, k*seg, seg)); err != nil {
				return fail(k, "send to", next, err)
			}
		}
	case v == n-1:
		for k := range segs {
			if err := c.Recv(ctx, prev, segment(buf, k*seg, seg)); err != nil {
				return fail(k, "recv from", prev, err)
			}
		}
	default:
		if err := c.Recv(ctx, prev, segment(buf, 0, seg)); err != nil {
			return fail(0, "recv from", prev, err)
		}
		for k := 1; k < segs; k++ {
			if err := c.SendRecv(ctx, next, segment(buf, (k-1)*seg, seg), prev, segment(buf, k*seg, seg)); err != nil {
				return fail(k, fmt.Sprintf("send to rank %d, recv from", next), prev, err)
			}
		}
		if err := c.Send(ctx, next, segment(buf, (segs-1)*seg, seg)); err != nil {
			return fail(segs-1, "send to", next, err)
		}
	}
	return nil
}
