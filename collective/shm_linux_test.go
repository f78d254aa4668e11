//go:build linux

package collective

import (
	"bytes"
	"context"
	"slices"
	"sync"
	"syscall"
	"testing"

	"github.com/kolo-dl/kolo/dtype"
	"github.com/kolo-dl/kolo/reduce"
	"github.com/kolo-dl/kolo/transport"
	"github.com/kolo-dl/kolo/transport/shm"
)

// Over a real segment, the exchanges that once went through the pair rings (an alltoall reserved
// every one of them: n² of /dev/shm) reserve nothing beyond what Open did; a plain Send does, which
// shows the measurement sees a ring when one is reserved.
func TestSharedExchangesReserveNoRings(t *testing.T) {
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=512m,huge=never"); err != nil {
		t.Skipf("needs a private tmpfs to count reserved pages (mount: %v)", err)
	}
	t.Cleanup(func() { syscall.Unmount(dir, 0) })
	used := func() int64 {
		var st syscall.Statfs_t
		if err := syscall.Statfs(dir, &st); err != nil {
			t.Fatalf("statfs %s: %v", dir, err)
		}
		return int64(st.Blocks-st.Bfree) * st.Bsize
	}
	const n, block = 8, 300_000
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	gs := make([]*shm.Group, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			gs[r], errs[r] = shm.Open(ctx, shm.Config{Name: "kolo-exchange-test", Rank: r, Size: n, Dir: dir})
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("open rank %d: %v", r, err)
		}
	}
	defer func() {
		for _, g := range gs {
			g.Close()
		}
	}()
	each := func(f func(r int, c transport.Comm) error) {
		t.Helper()
		for r := range n {
			wg.Go(func() { errs[r] = f(r, gs[r].Comm()) })
		}
		wg.Wait()
		for r, err := range errs {
			if err != nil {
				t.Fatalf("rank %d: %v", r, err)
			}
		}
	}
	base := used()
	each(func(r int, c transport.Comm) error {
		counts := slices.Repeat([]int{block}, n)
		recv := make([]byte, n*block)
		if err := Alltoall(ctx, c, bytes.Repeat([]byte{byte(r)}, n*block), counts, recv, counts, nil); err != nil {
			return err
		}
		if err := Allgather(ctx, c, make([]byte, block), recv, counts, nil); err != nil {
			return err
		}
		if err := Broadcast(ctx, c, make([]byte, 4*block), n-1, nil); err != nil {
			return err
		}
		return ReduceScatter(ctx, c, make([]byte, n*block), make([]byte, block), counts, dtype.Float32, reduce.Sum, nil)
	})
	if grew := used() - base; grew != 0 {
		t.Errorf("alltoall, allgather, broadcast and reduce-scatter of 8 ranks reserved %d bytes of rings; want none", grew)
	}
	each(func(r int, c transport.Comm) error {
		switch r {
		case 0:
			return c.Send(ctx, 1, make([]byte, 10))
		case 1:
			return c.Recv(ctx, 0, make([]byte, 10))
		}
		return nil
	})
	if used() == base {
		t.Errorf("a Send reserved nothing: the measurement does not see rings")
	}
}
