package collective

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/transport"
	"github.com/kolo-dl/kolo/internal/transport/inmem"
)

// testTimeout bounds every multi-rank test so that a hang fails with a message instead of stalling
// the package (which must finish in about a minute on two shared cores, under -race).
const testTimeout = 60 * time.Second

// ranks runs body once per rank of a fresh inmem group, each on its own goroutine, and returns
// each rank's error. comm chooses how a rank sees its endpoint. A rank whose body fails is killed,
// so that its peers fail fast with a PeerError instead of waiting for the timeout.
func ranks(t testing.TB, n int, opts []inmem.Option, comm func(*inmem.Endpoint) transport.Comm,
	body func(ctx context.Context, rank int, c transport.Comm) error) []error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	eps := inmem.New(n, opts...)
	defer func() {
		for _, e := range eps {
			e.Close()
		}
	}()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r, e := range eps {
		c := transport.Comm(e)
		if comm != nil {
			c = comm(e)
		}
		wg.Go(func() {
			if err := body(ctx, r, c); err != nil {
				errs[r] = err
				e.Kill(fmt.Errorf("test body of rank %d failed: %w", r, err))
			}
		})
	}
	wg.Wait()
	return errs
}

// mustRanks is ranks that fails the test on any rank's error.
func mustRanks(t testing.TB, n int, opts []inmem.Option, comm func(*inmem.Endpoint) transport.Comm,
	body func(ctx context.Context, rank int, c transport.Comm) error) {
	t.Helper()
	for r, err := range ranks(t, n, opts, comm, body) {
		if err != nil {
			t.Fatalf("rank %d of %d: %v", r, n, err)
		}
	}
}

// plainComm hides the Shared capability, so algorithms take their message-passing paths.
func plainComm(e *inmem.Endpoint) transport.Comm { return e.Comm() }

// sameOnAllRanks says which rank's bytes differ from rank 0's, or "".
func sameOnAllRanks(outs [][]byte) string {
	for r := 1; r < len(outs); r++ {
		if !bytes.Equal(outs[r], outs[0]) {
			i := 0
			for i < len(outs[0]) && i < len(outs[r]) && outs[r][i] == outs[0][i] {
				i++
			}
			return fmt.Sprintf("rank %d's result differs from rank 0's at byte %d", r, i)
		}
	}
	return ""
}

// wantPeerLost fails unless err wraps a *transport.PeerError naming rank.
func wantPeerLost(t testing.TB, what string, err error, rank int) {
	t.Helper()
	var pe *transport.PeerError
	if !errors.Is(err, transport.ErrPeerLost) || !errors.As(err, &pe) || pe.Rank != rank {
		t.Errorf("%s: got %v, want an error wrapping a *PeerError that names rank %d", what, err, rank)
	}
}

var rankCounts = []int{1, 2, 3, 4, 5, 8}

// exchangeModes are the transports the data-moving collectives (allgather, broadcast, alltoall,
// reduce-scatter) are tested over: pair rings only, and shared slots, large (one piece) and small
// (many pieces through both halves, and the fallback to rings where a half cannot hold a region
// per rank), with pieces capped or whole halves when ranks outnumber CPUs, and large slots with
// small pieces (a tuned SharedRoundBytes).
var exchangeModes = []struct {
	name string
	opts []inmem.Option
	comm func(*inmem.Endpoint) transport.Comm
	tun  *Tuning
}{
	{"rings", []inmem.Option{inmem.WithoutShared()}, plainComm, nil},
	{"slots", nil, nil, nil},
	{"small-slots", []inmem.Option{inmem.WithSlotBytes(16 << 10)}, nil, nil},
	{"small-slots-oversubscribed", []inmem.Option{inmem.WithSlotBytes(16 << 10), inmem.WithOversubscribed()}, nil, nil},
	{"tiny-slots", []inmem.Option{inmem.WithSlotBytes(1 << 10)}, nil, nil},
	{"slots-small-rounds", nil, nil, &Tuning{SharedRoundBytes: 4 << 10}},
}

// slotsOnly is a Shared group whose pair links fail: a collective that passes over it moved
// nothing through the rings.
type slotsOnly struct {
	transport.Comm
	transport.Shared
}

func (s slotsOnly) Send(context.Context, int, []byte) error {
	return errors.New("slotsOnly: Send used")
}
func (s slotsOnly) Recv(context.Context, int, []byte) error {
	return errors.New("slotsOnly: Recv used")
}
func (s slotsOnly) SendRecv(context.Context, int, []byte, int, []byte) error {
	return errors.New("slotsOnly: SendRecv used")
}
