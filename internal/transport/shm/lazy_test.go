//go:build linux

package shm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/kolo-dl/kolo/internal/transport"
)

// tmpfsDir returns a fresh directory on a tmpfs, where a file's st_blocks counts exactly the pages
// reserved for it: a tmpfs of the given size mounted for the test when this process may mount
// (root), else a directory under /dev/shm when that is a tmpfs.
func tmpfsDir(t *testing.T, size string) string {
	t.Helper()
	dir := t.TempDir()
	err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size="+size+",huge=never")
	if err == nil {
		t.Cleanup(func() {
			if err := syscall.Unmount(dir, 0); err != nil {
				t.Errorf("unmount %s: %v", dir, err)
			}
		})
		return dir
	}
	const tmpfsMagic = 0x01021994
	var st syscall.Statfs_t
	if serr := syscall.Statfs("/dev/shm", &st); serr != nil || st.Type != tmpfsMagic {
		t.Skipf("no tmpfs to count reserved pages on: mounting one failed (%v) and /dev/shm is not a tmpfs", err)
	}
	dir, err = os.MkdirTemp("/dev/shm", "kolo-lazy-test-")
	if err != nil {
		t.Fatalf("make a test directory under /dev/shm: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// allocated is how many bytes of the segment's file are reserved, from st_blocks.
func allocated(t *testing.T, g *Group) int64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Fstat(g.fd, &st); err != nil {
		t.Fatalf("stat the segment: %v", err)
	}
	return st.Blocks * 512
}

// resident reports, page by page, whether the segment's page is in memory (mincore): for a
// tmpfs, the pages some rank reserved and faulted in.
func resident(t *testing.T, g *Group) []bool {
	t.Helper()
	vec := make([]byte, len(g.mem)/pageBytes)
	_, _, e := syscall.Syscall(syscall.SYS_MINCORE, uintptr(unsafe.Pointer(&g.mem[0])), uintptr(len(g.mem)),
		uintptr(unsafe.Pointer(&vec[0])))
	if e != 0 {
		t.Fatalf("mincore: %v", e)
	}
	in := make([]bool, len(vec))
	for i, v := range vec {
		in[i] = v&1 != 0
	}
	return in
}

// ringRef names one ring of the segment: its kind and its sender and receiver.
type ringRef struct {
	msg      bool
	src, dst int
}

func (r ringRef) String() string {
	if r.msg {
		return fmt.Sprintf("message ring %d->%d", r.src, r.dst)
	}
	return fmt.Sprintf("data ring %d->%d", r.src, r.dst)
}

func (r ringRef) span(l layout) (off, n int64) {
	if r.msg {
		return l.msgRing(r.src, r.dst), int64(l.msgRingBytes)
	}
	return l.ring(r.src, r.dst), int64(l.ringBytes)
}

// checkReserved fails the test unless exactly the segment's prefix (header, controls, slots) and
// the given rings are reserved and in memory: st_blocks must be their sum, and mincore must find
// those pages and no other.
func checkReserved(t *testing.T, g *Group, rings ...ringRef) {
	t.Helper()
	l := g.lay
	want := make([]bool, len(g.mem)/pageBytes)
	mark := func(off, n int64) {
		for p := off / pageBytes; p < (off+n)/pageBytes; p++ {
			want[p] = true
		}
	}
	mark(0, l.reserved())
	total := l.reserved()
	for _, r := range rings {
		off, n := r.span(l)
		mark(off, n)
		total += n
	}
	if got := allocated(t, g); got != total {
		t.Errorf("segment has %d bytes reserved, want %d (header and slots %d, rings %v)", got, total, l.reserved(), rings)
	}
	// Report runs of wrong pages, not each page: a ring wrongly faulted in is dozens of them.
	in := resident(t, g)
	for p := 0; p < len(in); {
		q := p + 1
		for q < len(in) && in[q] == in[p] && want[q] == want[p] && l.describe(int64(q)*pageBytes) == l.describe(int64(p)*pageBytes) {
			q++
		}
		if in[p] != want[p] {
			t.Errorf("pages %d-%d (offset %d, %s): in memory %v, want %v", p, q-1, int64(p)*pageBytes,
				l.describe(int64(p)*pageBytes), in[p], want[p])
		}
		p = q
	}
}

// describe names the part of the segment that offset off lies in, for test failures.
func (l layout) describe(off int64) string {
	switch {
	case off < l.slots:
		return "header"
	case off < l.rings:
		return fmt.Sprintf("slot %d", (off-l.slots)/int64(l.slotBytes))
	}
	for src := range l.size {
		for dst := range l.size {
			if src == dst {
				continue
			}
			for _, r := range []ringRef{{false, src, dst}, {true, src, dst}} {
				if o, n := r.span(l); off >= o && off < o+n {
					return r.String()
				}
			}
		}
	}
	return "past the end"
}

func TestOpenReservesHeaderAndSlotsOnly(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  func(t *testing.T) Config
	}{
		{"2 ranks", func(t *testing.T) Config { return testConfig(t, 2) }},
		{"3 ranks", func(t *testing.T) Config { return testConfig(t, 3) }},
		{"8 ranks, default sizes", func(t *testing.T) Config {
			return Config{Name: fmt.Sprintf("kolo-lazy-%d", os.Getpid()), Size: 8, Timeout: 10 * time.Second}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg(t)
			cfg.Dir = tmpfsDir(t, "256m")
			reserved, total := ReservedBytes(cfg), SegmentBytes(cfg)
			if reserved <= 0 || reserved >= total {
				t.Fatalf("ReservedBytes = %d, SegmentBytes = %d: want 0 < reserved < total", reserved, total)
			}
			gs := openAll(t, cfg)
			if got := allocated(t, gs[0]); got != reserved {
				t.Errorf("after Open %d bytes are reserved, want ReservedBytes %d (segment %d)", got, reserved, total)
			}
			checkReserved(t, gs[0])
		})
	}
}

// Each case moves some traffic among 3 ranks and lists the rings it must have reserved: only
// those, whichever side uses them first and however many use them at once.
func TestFirstUseReservesOnlyItsRing(t *testing.T) {
	ctx := context.Background()
	send := func(gs []*Group, from, to int, b []byte) error {
		errs := make(chan error, 1)
		go func() {
			got := make([]byte, len(b))
			err := gs[to].Comm().Recv(ctx, from, got)
			if err == nil && string(got) != string(b) {
				err = fmt.Errorf("rank %d got %q from %d, want %q", to, got, from, b)
			}
			errs <- err
		}()
		return errors.Join(gs[from].Comm().Send(ctx, to, b), <-errs)
	}
	// alltoall has the given ranks exchange buffers pairwise, all at once, with SendRecv: in step
	// k each sends to the rank k after it and receives from the rank k before it, so both ends
	// of a pair use their rings for the first time together.
	alltoall := func(gs []*Group, ranks ...int) error {
		var wg sync.WaitGroup
		errs := make([]error, len(ranks))
		for i, me := range ranks {
			wg.Go(func() {
				for k := 1; k < len(ranks); k++ {
					to, from := ranks[(i+k)%len(ranks)], ranks[(i-k+len(ranks))%len(ranks)]
					sb, rb := payload(me, to, k, 100<<10), make([]byte, 100<<10)
					if err := gs[me].Comm().SendRecv(ctx, to, sb, from, rb); err != nil {
						errs[i] = err
						return
					}
					if string(rb) != string(payload(from, me, k, len(rb))) {
						errs[i] = fmt.Errorf("rank %d: wrong bytes from rank %d", me, from)
						return
					}
				}
			})
		}
		wg.Wait()
		return errors.Join(errs...)
	}
	// messages has each listed sender send a message to its receiver, all at once, and every
	// receiver read what it was sent.
	messages := func(gs []*Group, pairs ...[2]int) error {
		var wg sync.WaitGroup
		errs := make([]error, len(pairs))
		for i, p := range pairs {
			wg.Go(func() {
				errs[i] = gs[p[0]].Messenger().SendMsg(ctx, p[1], []byte(fmt.Sprintf("from %d", p[0])))
			})
		}
		wg.Wait()
		for _, p := range pairs {
			select {
			case m := <-gs[p[1]].Messenger().Inbox():
				if string(m.Body) != fmt.Sprintf("from %d", m.From) {
					return fmt.Errorf("rank %d got %q from %d", p[1], m.Body, m.From)
				}
			case <-time.After(10 * time.Second):
				return fmt.Errorf("rank %d: no message from rank %d", p[1], p[0])
			}
		}
		return nil
	}
	for _, tc := range []struct {
		name  string
		run   func(gs []*Group) error
		rings []ringRef
	}{
		{"nothing", func([]*Group) error { return nil }, nil},
		{"empty send", func(gs []*Group) error { return gs[0].Comm().Send(ctx, 1, nil) }, nil},
		{"send to itself", func(gs []*Group) error {
			return errors.Join(gs[0].Comm().Send(ctx, 0, []byte("x")), gs[0].Comm().Recv(ctx, 0, make([]byte, 1)))
		}, nil},
		{"send", func(gs []*Group) error { return send(gs, 0, 1, []byte("hello")) },
			[]ringRef{{false, 0, 1}}},
		{"send longer than the ring", func(gs []*Group) error { return send(gs, 2, 0, payload(2, 0, 0, 3*(64<<10)+17)) },
			[]ringRef{{false, 2, 0}}},
		{"sendrecv both ways at once", func(gs []*Group) error { return alltoall(gs, 0, 1) },
			[]ringRef{{false, 0, 1}, {false, 1, 0}}},
		{"every pair at once", func(gs []*Group) error { return alltoall(gs, 0, 1, 2) },
			[]ringRef{{false, 0, 1}, {false, 1, 0}, {false, 0, 2}, {false, 2, 0}, {false, 1, 2}, {false, 2, 1}}},
		{"message", func(gs []*Group) error { return messages(gs, [2]int{1, 2}) },
			[]ringRef{{true, 1, 2}}},
		{"messages both ways at once", func(gs []*Group) error { return messages(gs, [2]int{0, 2}, [2]int{2, 0}) },
			[]ringRef{{true, 0, 2}, {true, 2, 0}}},
		{"message to itself", func(gs []*Group) error { return messages(gs, [2]int{1, 1}) }, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t, 3)
			cfg.Dir = tmpfsDir(t, "64m")
			gs := openAll(t, cfg)
			if err := tc.run(gs); err != nil {
				t.Fatal(err)
			}
			checkReserved(t, gs[0], tc.rings...)
		})
	}
}

// A ring that does not fit /dev/shm at its first use fails the Send or SendMsg that needed it,
// with an error that names the ring and says what to do, where touching its pages would have
// been a SIGBUS; the group stays usable, and an abort (what the engine does with any failed
// collective) frees the peer that waited for the data.
func TestRingThatDoesNotFitFailsItsFirstSend(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		send func(g *Group) error
		ring string
	}{
		{"data ring", func(g *Group) error { return g.Comm().Send(ctx, 1, []byte("hello")) }, "data ring"},
		{"data ring of a sendrecv", func(g *Group) error {
			return g.Comm().SendRecv(ctx, 1, []byte("hello"), 1, make([]byte, 5))
		}, "data ring"},
		{"message ring", func(g *Group) error { return g.Messenger().SendMsg(ctx, 1, []byte("hello")) }, "message ring"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The header and two 64 KiB slots fit 512 KiB; a 1 MiB ring does not.
			dir := smallTmpfs(t, "512k")
			cfg := testConfig(t, 2)
			cfg.Dir, cfg.RingBytes, cfg.MsgRingBytes, cfg.Ranks = dir, 1<<20, 1<<20, []int{10, 11}
			gs := openAll(t, cfg)
			err := tc.send(gs[0])
			t.Log(err)
			if err == nil {
				t.Fatal("the send succeeded, though its ring does not fit")
			}
			if !errors.Is(err, syscall.ENOSPC) {
				t.Errorf("error does not wrap ENOSPC: %v", err)
			}
			if errors.Is(err, transport.ErrPeerLost) || errors.Is(err, transport.ErrAborted) {
				t.Errorf("error blames a peer, not the full file system: %v", err)
			}
			for _, want := range []string{tc.ring, "local ranks 0->1", "job ranks 10->11", "needs 1 MiB", dir, "free",
				"reserved 136 KiB at start", "--shm-size"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error does not say %q: %v", want, err)
				}
			}
			if got, want := allocated(t, gs[0]), gs[0].lay.reserved(); got != want {
				t.Errorf("after the failed reservation %d bytes are reserved, want %d as before", got, want)
			}
			if err := tc.send(gs[0]); err == nil || !errors.Is(err, syscall.ENOSPC) {
				t.Errorf("second send: %v, want it to try to reserve again and fail the same way", err)
			}
			// The engine aborts the group after a failed collective: the receiver must not hang.
			gs[0].Abort(err)
			if rerr := gs[1].Comm().Recv(ctx, 0, make([]byte, 5)); !errors.Is(rerr, transport.ErrAborted) {
				t.Errorf("the peer's Recv after the abort: %v, want ErrAborted", rerr)
			}
		})
	}
}

func TestSizeTextRoundsUp(t *testing.T) {
	for _, tc := range []struct {
		n    int64
		want string
	}{
		{0, "0 KiB"},
		{1, "1 KiB"},
		{64 << 10, "64 KiB"},
		{1<<20 - 1, "1024 KiB"},
		{1 << 20, "1 MiB"},
		{1<<20 + 1, "1.1 MiB"},
		{16<<20 + 8<<10, "16.1 MiB"},
		{1403 << 20, "1403 MiB"},
	} {
		if got := sizeText(tc.n); got != tc.want {
			t.Errorf("sizeText(%d) = %q, want %q", tc.n, got, tc.want)
		}
	}
}
