package collective

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/kolo-dl/kolo/internal/dtype"
	"github.com/kolo-dl/kolo/internal/reduce"
	"github.com/kolo-dl/kolo/internal/transport"
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

// SlotStoresMeasurement is what one group's measurement of its slot stores found, for the caller
// to report (Tuning.SlotStoresMeasured): this package does not log.
type SlotStoresMeasurement struct {
	Ranks            int
	Chosen           SlotStores
	Streaming, Plain []time.Duration // this rank's trial times of each mode, in the order run; none if it ran no trials
}

// slotStores returns the store mode for s's slots: tun's, else the one measured for s (measuring
// it now, collectively, on the group's first shared collective). The measured mode is kept in the
// group's Memo, so it lives and goes with the group: a re-formed world measures its own, and a
// closed one leaves nothing behind in this package. A group whose ranks outnumber the CPUs
// measures too (plain stores gained 20% at 64 MiB with 4 ranks on the 2-vCPU Xeon VM): its
// barriers sleep, which adds to both modes' times alike, and a noisy measurement keeps the
// streaming stores unless plain ones are clearly faster.
func slotStores(ctx context.Context, c transport.Comm, s transport.Shared, tun *Tuning) (SlotStores, error) {
	if tun != nil && tun.SlotStores != SlotStoresAuto {
		return tun.SlotStores, nil
	}
	if c.Size() < 2 {
		return SlotStoresStreaming, nil
	}
	memo := s.Memo()
	if m := SlotStores(memo.Load()); m != SlotStoresAuto {
		return m, nil
	}
	m, err := calibrateSlotStores(ctx, c, s, tun)
	if err != nil {
		return 0, err
	}
	memo.Store(uint32(m.Chosen))
	if c.Rank() == 0 && tun != nil && tun.SlotStoresMeasured != nil && len(m.Streaming) > 0 {
		tun.SlotStoresMeasured(m)
	}
	return m.Chosen, nil
}

// calibrateRounds is how many shared allreduces of each mode calibrateSlotStores times; the
// fastest of each is compared, so one descheduled round does not decide.
const calibrateRounds = 6

// calibrateBytes is the buffer of those allreduces, split among the ranks (each rank's share of
// the work stays about the same at any group size), within calibrateMin and calibrateMax.
const (
	calibrateBytes = 4 << 20
	calibrateMin   = 64 << 10
	calibrateMax   = 2 << 20
)

// trialFunc runs one timed trial of mode on this rank: all ranks of the group call it alike, and
// it returns only once no rank reads the slots any more (the shared allreduce ends with a
// barrier), since rank 0 writes its choice into its slot after the last one.
type trialFunc func(ctx context.Context, mode SlotStores) (time.Duration, error)

// calibrateSlotStores times the shared allreduce itself with each kind of store, alternately,
// calibrateRounds times each, and decides on rank 0: plain stores if their fastest allreduce beat
// the streaming stores' fastest by 10%, else streaming (the choice kolo made before it measured).
// Rank 0 then publishes the choice in its slot, so that every rank uses the same.
//
// What is timed is the collective, not a transfer standing for it: a first version timed 1 MiB
// copied from rank 0's slot to rank 1, one way, one core writing while the other waited, and on
// an AMD EPYC VM where the allreduce ran 2-3x faster with streaming stores that copy took about
// the same time either way, so noise decided, and a third of runs chose plain stores and ran at
// their speed throughout (docs/benchmarks.md, "What moved 2-rank bandwidth").
func calibrateSlotStores(ctx context.Context, c transport.Comm, s transport.Shared, tun *Tuning) (SlotStoresMeasurement, error) {
	n := c.Size()
	round := tun.sharedRound() // the rounds the group's allreduces take
	// A few rounds at most where slots are small (tests' groups): the modes differ per byte.
	size := min(max(calibrateBytes/n, calibrateMin), calibrateMax, 4*len(s.Slot(c.Rank()))) / 64 * 64
	if size == 0 {
		return SlotStoresMeasurement{Ranks: n, Chosen: SlotStoresStreaming}, nil
	}
	buf := make([]byte, size)
	trial := func(ctx context.Context, mode SlotStores) (time.Duration, error) {
		t := &Tuning{SlotStores: mode, SharedRoundBytes: round}
		start := time.Now()
		err := sharedRounds(ctx, "shared allreduce", c, s, nil, buf, dtype.Float32, reduce.Sum, 1, t)
		return time.Since(start), err
	}
	return decideSlotStores(ctx, c, s, trial)
}

// decideSlotStores runs the trials, alternating the modes, and has rank 0 choose and publish. Every
// rank's measurement has the choice; the trial times are its own.
func decideSlotStores(ctx context.Context, c transport.Comm, s transport.Shared, trial trialFunc) (SlotStoresMeasurement, error) {
	r := c.Rank()
	var took [2][]time.Duration // by mode: streaming, plain
	for i := range 2 * calibrateRounds {
		mode, k := SlotStoresStreaming, 0
		if i%2 == 1 {
			mode, k = SlotStoresPlain, 1
		}
		d, err := trial(ctx, mode)
		if err != nil {
			return SlotStoresMeasurement{}, fmt.Errorf("calibrate slot stores: %v stores, trial %d: %w", mode, i/2+1, err)
		}
		took[k] = append(took[k], d)
	}
	slot := s.Slot(0)
	if r == 0 {
		slot[0] = byte(SlotStoresStreaming)
		if slices.Min(took[1])*10 < slices.Min(took[0])*9 {
			slot[0] = byte(SlotStoresPlain)
		}
	}
	if err := s.Barrier(ctx); err != nil {
		return SlotStoresMeasurement{}, fmt.Errorf("calibrate slot stores: barrier after the choice: %w", err)
	}
	m := SlotStoresMeasurement{Ranks: c.Size(), Chosen: SlotStores(slot[0]), Streaming: took[0], Plain: took[1]}
	// Nobody writes a slot again until every rank has read the choice.
	if err := s.Barrier(ctx); err != nil {
		return SlotStoresMeasurement{}, fmt.Errorf("calibrate slot stores: barrier after reading the choice: %w", err)
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
