package collective

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/transport"
	"github.com/kolo-dl/kolo/internal/transport/inmem"
)

// The measured store mode is one for the whole group, taken once (also where ranks outnumber the
// CPUs): a later call on one rank alone returns it without any barrier. A fixed mode needs no
// measurement at all.
func TestSlotStoresMeasuredOnceForTheGroup(t *testing.T) {
	for _, tc := range []struct {
		name     string
		opts     []inmem.Option
		tun      *Tuning
		want     SlotStores // 0: either measured mode, alike on every rank
		measured bool
	}{
		{"measured", []inmem.Option{inmem.WithSlotBytes(2 << 20)}, nil, 0, true},
		{"small slots", []inmem.Option{inmem.WithSlotBytes(100)}, nil, 0, true},
		{"fixed streaming", nil, &Tuning{SlotStores: SlotStoresStreaming}, SlotStoresStreaming, false},
		{"fixed plain", nil, &Tuning{SlotStores: SlotStoresPlain}, SlotStoresPlain, false},
		{"oversubscribed", []inmem.Option{inmem.WithOversubscribed(), inmem.WithSlotBytes(2 << 20)}, nil, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const n = 3
			got := make([]SlotStores, n)
			var shared []transport.Shared
			eps := inmem.New(n, tc.opts...)
			defer func() {
				for _, e := range eps {
					e.Close()
				}
			}()
			for _, e := range eps {
				shared = append(shared, e)
			}
			one := func(r int) error {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				m, err := slotStores(ctx, eps[r], shared[r], tc.tun)
				got[r] = m
				return err
			}
			if !tc.measured {
				// Alone: a measurement would wait for the others' barriers and time out.
				for r := range n {
					if err := one(r); err != nil || got[r] != tc.want {
						t.Fatalf("rank %d alone: %v, %v; want %v at once", r, got[r], err, tc.want)
					}
				}
				return
			}
			errs := make(chan error, n)
			for r := range n {
				go func() { errs <- one(r) }()
			}
			for range n {
				if err := <-errs; err != nil {
					t.Fatal(err)
				}
			}
			if got[0] != SlotStoresStreaming && got[0] != SlotStoresPlain {
				t.Fatalf("measured mode %v", got[0])
			}
			for r := range n {
				if got[r] != got[0] {
					t.Fatalf("ranks chose differently: %v", got)
				}
			}
			first := got[0]
			if err := one(1); err != nil || got[1] != first {
				t.Fatalf("rank 1 asking again alone: %v, %v; want the group's %v without a barrier", got[1], err, first)
			}
		})
	}
}

// A rank lost before the measurement fails it on every other rank, naming the loss, instead of
// leaving them at a barrier.
func TestSlotStoresMeasurementLosesARank(t *testing.T) {
	const n = 3
	errs := ranks(t, n, []inmem.Option{inmem.WithSlotBytes(2 << 20)}, nil, func(ctx context.Context, r int, c transport.Comm) error {
		if r == 1 {
			return errors.New("rank 1 dies before the first allreduce")
		}
		_, err := slotStores(ctx, c, c.(transport.Shared), nil)
		return err
	})
	for _, r := range []int{0, 2} {
		if !errors.Is(errs[r], transport.ErrPeerLost) || !strings.Contains(errs[r].Error(), "calibrate slot stores") {
			t.Errorf("rank %d: %v, want a lost peer during the measurement", r, errs[r])
		}
	}
}

// The faster mode by the trials wins, plain stores only by 10%, and every rank gets rank 0's
// choice even when its own trials say otherwise.
func TestSlotStoresFollowTheTrials(t *testing.T) {
	for _, tc := range []struct {
		name             string
		streaming, plain time.Duration // rank 0's trials; the others' are reversed
		want             SlotStores
	}{
		{"plain twice as fast", 2 * time.Millisecond, time.Millisecond, SlotStoresPlain},
		{"streaming twice as fast", time.Millisecond, 2 * time.Millisecond, SlotStoresStreaming},
		{"plain 5% faster: not enough", 1000 * time.Microsecond, 950 * time.Microsecond, SlotStoresStreaming},
		{"plain 15% faster", 1000 * time.Microsecond, 850 * time.Microsecond, SlotStoresPlain},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const n = 3
			got := make([]SlotStores, n)
			errs := ranks(t, n, []inmem.Option{inmem.WithSlotBytes(1 << 20)}, nil, func(ctx context.Context, r int, c transport.Comm) error {
				trial := func(_ context.Context, mode SlotStores) (time.Duration, error) {
					plain := mode == SlotStoresPlain
					if r != 0 {
						plain = !plain
					}
					if plain {
						return tc.plain, nil
					}
					return tc.streaming, nil
				}
				m, err := decideSlotStores(ctx, c, c.(transport.Shared), trial)
				got[r] = m.Chosen
				return err
			})
			for r := range n {
				if errs[r] != nil || got[r] != tc.want {
					t.Errorf("rank %d: %v, %v; want %v", r, got[r], errs[r], tc.want)
				}
			}
		})
	}
}

// A trial that fails fails the measurement on that rank, saying which.
func TestSlotStoresTrialFails(t *testing.T) {
	errs := ranks(t, 2, []inmem.Option{inmem.WithSlotBytes(1 << 20)}, nil, func(ctx context.Context, r int, c transport.Comm) error {
		trial := func(context.Context, SlotStores) (time.Duration, error) {
			if r == 1 {
				return 0, errors.New("no memory")
			}
			return time.Millisecond, nil
		}
		_, err := decideSlotStores(ctx, c, c.(transport.Shared), trial)
		return err
	})
	if errs[1] == nil || !strings.Contains(errs[1].Error(), "streaming stores, trial 1: no memory") {
		t.Fatalf("rank 1: %v", errs[1])
	}
}

// The measurement is reported to the caller once, on rank 0 only, with the choice every rank
// made and rank 0's trial times (the engine logs it; this package does not).
func TestSlotStoresMeasurementReported(t *testing.T) {
	const n = 3
	var reports []SlotStoresMeasurement // written by rank 0 only
	got := make([]SlotStores, n)
	errs := ranks(t, n, []inmem.Option{inmem.WithSlotBytes(2 << 20)}, nil, func(ctx context.Context, r int, c transport.Comm) error {
		tun := &Tuning{SlotStoresMeasured: func(m SlotStoresMeasurement) {
			if r != 0 {
				t.Errorf("rank %d reported a measurement", r)
			}
			reports = append(reports, m)
		}}
		var err error
		for range 2 { // the second call finds the group's choice and measures nothing
			if got[r], err = slotStores(ctx, c, c.(transport.Shared), tun); err != nil {
				return err
			}
		}
		return nil
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	if len(reports) != 1 {
		t.Fatalf("%d reports, want 1", len(reports))
	}
	m := reports[0]
	if m.Ranks != n || m.Chosen != got[0] || len(m.Streaming) != calibrateRounds || len(m.Plain) != calibrateRounds {
		t.Errorf("report %+v, want %d ranks, choice %v, %d trials of each mode", m, n, got[0], calibrateRounds)
	}
}
