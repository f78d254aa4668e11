package collective

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/kolo-dl/kolo/reduce"
	"github.com/kolo-dl/kolo/transport"
)

// SlotStores is how a rank writes into its shared-memory slot what another core then reads.
//
// Streaming stores (reduce.StreamCopy) send the data to memory, and the reader streams it back
// at memory speed; plain stores leave it in the writer's cache, and the reader pulls it from
// there. Which is faster depends on the machine: on a 2-vCPU AMD EPYC VM whose two vCPUs sat far
// apart, streaming stores took a 2-rank 4 MiB allreduce from 5.5 to 9.5-12 GB/s busbw; on a 2-vCPU
// Intel Xeon VM whose vCPUs share one last-level cache, plain stores were the faster (4 MiB:
// 5.6-7.0 against 4.8-5.2 GB/s; 64 MiB: 6.1 against 3.8-4.5; `kolo bench allreduce -np 2`,
// four runs each, alternated). So by default the first shared collective of a group measures
// both (calibrateSlotStores) and every later one uses the faster.
type SlotStores int8

const (
	SlotStoresAuto      SlotStores = iota // measured once per group, at its first shared collective
	SlotStoresStreaming                   // always streaming stores
	SlotStoresPlain                       // always plain stores
)

func (m SlotStores) String() string {
	switch m {
	case SlotStoresStreaming:
		return "streaming"
	case SlotStoresPlain:
		return "plain"
	}
	return "auto"
}

// slotStoresOf remembers the measured choice of each group, by its Shared capability.
var slotStoresOf sync.Map // transport.Shared -> SlotStores

// slotStores returns the store mode for s's slots: tun's, else the one measured for s (measuring
// it now, collectively, on the group's first shared collective). A group whose ranks outnumber the
// CPUs measures too (plain stores gained 20% at 64 MiB with 4 ranks on the 2-vCPU Xeon VM): its
// barriers sleep, which adds to both modes' times alike, and a noisy measurement keeps the
// streaming stores unless plain ones are clearly faster.
func slotStores(ctx context.Context, c transport.Comm, s transport.Shared, tun *Tuning) (SlotStores, error) {
	if tun != nil && tun.SlotStores != SlotStoresAuto {
		return tun.SlotStores, nil
	}
	if c.Size() < 2 {
		return SlotStoresStreaming, nil
	}
	if m, ok := slotStoresOf.Load(s); ok {
		return m.(SlotStores), nil
	}
	m, err := calibrateSlotStores(ctx, c, s)
	if err != nil {
		return 0, err
	}
	slotStoresOf.Store(s, m)
	return m, nil
}

// calibrateRounds is how many transfers of each mode calibrateSlotStores times; the fastest of
// each is compared, so one descheduled round does not decide.
const (
	calibrateRounds = 6
	calibrateBytes  = 1 << 20 // a round of the shared allreduce
)

// calibrateSlotStores times a transfer of one round's bytes from rank 0's slot to rank 1, with
// each kind of store, alternately, and decides on rank 0: plain stores if their fastest transfer
// beat the streaming stores' fastest by 10%, else streaming (the choice kolo made before it
// measured). Rank 0 then publishes the choice in its slot, so that every rank uses the same.
// Every rank of c takes part (the barriers are the group's); about 30 barriers and 12 MiB of
// copies, once per group.
func calibrateSlotStores(ctx context.Context, c transport.Comm, s transport.Shared) (SlotStores, error) {
	r := c.Rank()
	slot := s.Slot(0)
	n := min(len(slot), calibrateBytes) / 64 * 64
	if n == 0 {
		return SlotStoresStreaming, nil
	}
	var buf []byte
	if r <= 1 {
		buf = make([]byte, n)
	}
	var took [2][]time.Duration // by mode: streaming, plain
	for i := range 2 * calibrateRounds {
		plain := i%2 == 1
		start := time.Now()
		if r == 0 {
			if plain {
				copy(slot[:n], buf)
			} else {
				reduce.StreamCopy(slot[:n], buf)
			}
		}
		if err := s.Barrier(ctx); err != nil {
			return 0, fmt.Errorf("calibrate slot stores: barrier after the write: %w", err)
		}
		if r == 1 {
			copy(buf, slot[:n])
		}
		if err := s.Barrier(ctx); err != nil {
			return 0, fmt.Errorf("calibrate slot stores: barrier after the read: %w", err)
		}
		if r == 0 {
			mode := 0
			if plain {
				mode = 1
			}
			took[mode] = append(took[mode], time.Since(start))
		}
	}
	if r == 0 {
		slot[0] = byte(SlotStoresStreaming)
		if slices.Min(took[1])*10 < slices.Min(took[0])*9 {
			slot[0] = byte(SlotStoresPlain)
		}
	}
	if err := s.Barrier(ctx); err != nil {
		return 0, fmt.Errorf("calibrate slot stores: barrier after the choice: %w", err)
	}
	m := SlotStores(slot[0])
	// Nobody writes a slot again until every rank has read the choice.
	if err := s.Barrier(ctx); err != nil {
		return 0, fmt.Errorf("calibrate slot stores: barrier after reading the choice: %w", err)
	}
	return m, nil
}

// slotCopy writes src into dst, part of this rank's slot, the way m says.
func slotCopy(m SlotStores, dst, src []byte) {
	if m == SlotStoresPlain {
		copy(dst, src)
		return
	}
	reduce.StreamCopy(dst, src)
}
