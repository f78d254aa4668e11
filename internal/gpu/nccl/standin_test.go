//go:build cgo && linux

package nccl

// Tests of the C layer (dl.go) through its real dlopen path, against the stand-in libnccl.so.2
// and libcudart.so.12 (testbed/ncclstandin): ranks are goroutines of this process, each on a
// device of its own, meeting through files as separate processes would.

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/kolo-dl/kolo/internal/gpu"
	"github.com/kolo-dl/kolo/testbed/ncclstandin"
)

var standin struct {
	once sync.Once
	libs ncclstandin.Libs
	err  error
}

// standinBackend is the stand-in, loaded through open. It binds the C layer again on every call:
// other tests bind it to other libraries.
func standinBackend(t *testing.T) *backend {
	t.Helper()
	standin.once.Do(func() {
		dir, err := os.MkdirTemp("", "kolo-standin-")
		if err != nil {
			standin.err = err
			return
		}
		standin.libs, standin.err = ncclstandin.Build(dir, ncclstandin.Variant{})
	})
	if standin.err != nil {
		t.Fatal(standin.err)
	}
	t.Setenv("STANDIN_NCCL_DIR", t.TempDir())
	report := filepath.Join(t.TempDir(), "report")
	t.Setenv("STANDIN_REPORT", report)
	t.Setenv("STANDIN_DEADLINE_S", "30")
	t.Cleanup(func() {
		if r := ncclstandin.Reports(report); r != "" && !t.Failed() {
			t.Errorf("the stand-in reported misuse:\n%s", r)
		}
	})
	b, err := open(Options{NCCLPaths: []string{standin.libs.NCCL}, CUDAPaths: []string{standin.libs.CUDA}, CallTimeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestMain(m *testing.M) {
	code := m.Run()
	if standin.libs.Dir != "" {
		os.RemoveAll(standin.libs.Dir)
	}
	os.Exit(code)
}

// rankState is one rank of a test: its device, stream and communicator.
type rankState struct {
	dev gpu.Device
	s   gpu.Stream
	c   gpu.Comm
}

// form makes a communicator of n ranks, rank r on device r, and a stream for each.
func form(t *testing.T, b *backend, n int) []*rankState {
	t.Helper()
	id, err := b.NewUniqueID()
	if err != nil {
		t.Fatal(err)
	}
	rs := make([]*rankState, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		rs[r] = &rankState{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			d, err := b.Device(r)
			if err == nil {
				rs[r].dev = d
				rs[r].s, err = d.NewStream()
			}
			if err == nil {
				rs[r].c, err = b.NewComm(ctx, d, id, n, r)
			}
			errs[r] = err
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	return rs
}

// mem is device memory of the stand-in, which is host memory: the test reads and writes it.
func mem(p gpu.Ptr, n int) []byte {
	return unsafe.Slice(*(**byte)(unsafe.Pointer(&p)), n)
}

func alloc(t *testing.T, d gpu.Device, n int) gpu.Ptr {
	t.Helper()
	p, err := d.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func putF32(b []byte, vs ...float32) {
	for i, v := range vs {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
}

func f32s(b []byte) []float32 {
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

func sync1(t *testing.T, s gpu.Stream) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := s.Synchronize(ctx); err != nil {
		t.Fatal(err)
	}
}

// each runs f on every rank at once and fails the test with the ranks' errors.
func each(t *testing.T, rs []*rankState, f func(r int, x *rankState) error) {
	t.Helper()
	errs := make([]error, len(rs))
	var wg sync.WaitGroup
	for r, x := range rs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = f(r, x)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

func destroy(t *testing.T, rs []*rankState) {
	t.Helper()
	each(t, rs, func(r int, x *rankState) error {
		if err := x.c.Destroy(); err != nil {
			return fmt.Errorf("rank %d: destroy: %w", r, err)
		}
		return x.s.Destroy()
	})
}

func TestStandinCollectives(t *testing.T) {
	b := standinBackend(t)
	const n, count = 3, 5
	rs := form(t, b, n)
	for r, x := range rs {
		if x.c.Rank() != r || x.c.Size() != n {
			t.Fatalf("rank %d: comm says rank %d of %d", r, x.c.Rank(), x.c.Size())
		}
	}
	type bufs struct{ in, out, gather, scatter, a2a, a2aOut gpu.Ptr }
	bs := make([]bufs, n)
	for r, x := range rs {
		bs[r] = bufs{alloc(t, x.dev, 4*count), alloc(t, x.dev, 4*count), alloc(t, x.dev, 4*count*n),
			alloc(t, x.dev, 4*n), alloc(t, x.dev, 4*n*(n+1)/2), alloc(t, x.dev, 4*(r+1)*n)}
		in := make([]float32, count)
		for i := range in {
			in[i] = float32(r*10 + i)
		}
		putF32(mem(bs[r].in, 4*count), in...)
	}
	each(t, rs, func(r int, x *rankState) error {
		if err := x.c.AllReduce(bs[r].in, bs[r].out, count, gpu.Float32, gpu.Sum, x.s); err != nil {
			return err
		}
		if err := x.c.AllGather(bs[r].in, bs[r].gather, count, gpu.Float32, x.s); err != nil {
			return err
		}
		if err := x.c.ReduceScatter(bs[r].gather, bs[r].scatter, 1, gpu.Float32, gpu.Max, x.s); err != nil {
			return err
		}
		// Uneven all-to-all: rank r sends p+1 elements to rank p, all equal to r.
		send := make([]float32, 0, n*(n+1)/2)
		sendCounts, sendDispls, recvCounts, recvDispls := make([]int, n), make([]int, n), make([]int, n), make([]int, n)
		for p := range n {
			sendCounts[p], sendDispls[p] = p+1, len(send)
			for range p + 1 {
				send = append(send, float32(r))
			}
			recvCounts[p], recvDispls[p] = r+1, p*(r+1)
		}
		putF32(mem(bs[r].a2a, 4*len(send)), send...)
		return gpu.AllToAll(x.c, bs[r].a2a, sendCounts, sendDispls, bs[r].a2aOut, recvCounts, recvDispls, gpu.Float32, x.s)
	})
	for r, x := range rs {
		sync1(t, x.s)
		got := f32s(mem(bs[r].out, 4*count))
		for i, v := range got {
			if want := float32(10*(0+1+2) + 3*i); v != want {
				t.Errorf("rank %d: allreduce[%d] = %v, want %v", r, i, v, want)
			}
		}
		for i, v := range f32s(mem(bs[r].gather, 4*count*n)) {
			if want := float32(10*(i/count) + i%count); v != want {
				t.Errorf("rank %d: allgather[%d] = %v, want %v", r, i, v, want)
			}
		}
		for i, v := range f32s(mem(bs[r].scatter, 4)) {
			if want := float32(10*(r*1/count) + r*1%count); v != want && i == 0 {
				t.Errorf("rank %d: reducescatter = %v, want %v", r, v, want)
			}
		}
		for i, v := range f32s(mem(bs[r].a2aOut, 4*(r+1)*n)) {
			if want := float32(i / (r + 1)); v != want {
				t.Errorf("rank %d: alltoall[%d] = %v, want %v", r, i, v, want)
			}
		}
	}
	destroy(t, rs)
}

// A collective blocks until every rank reaches it; a rank that never does leaves the others
// blocked until they abort.
func TestStandinLostRankNeedsAbort(t *testing.T) {
	b := standinBackend(t)
	rs := form(t, b, 2)
	x := rs[0]
	p := alloc(t, x.dev, 64)
	if err := x.c.AllReduce(p, p, 16, gpu.Float32, gpu.Sum, x.s); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := x.s.Synchronize(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("synchronize with rank 1 missing: %v, want the deadline", err)
	}
	if err := x.c.AsyncError(); err != nil {
		t.Fatalf("async error while blocked: %v", err)
	}
	if err := x.c.Abort(); err != nil {
		t.Fatal(err)
	}
	sync1(t, x.s)
	if err := x.c.AsyncError(); !errors.Is(err, gpu.ErrAborted) {
		t.Fatalf("async error after abort: %v", err)
	}
	if err := rs[1].c.Abort(); err != nil {
		t.Fatal(err)
	}
}

// NCCL keeps the newcomm pointer of a non-blocking init and writes through it from its own
// thread when set-up ends (2.14 to 2.17); the stand-in does too, and reports when what it left
// there changed meanwhile: storage the caller reused (a C stack local) is written after its
// frame is gone.
func TestNewCommKeepsNewcommAlive(t *testing.T) {
	b := standinBackend(t)
	for range 3 {
		for _, n := range []int{1, 2, 3} {
			destroy(t, form(t, b, n))
		}
	}
}

// A split completes on NCCL's thread: the new communicator is in *newcomm only then. Members get
// a communicator numbered by key, non-members (NoColor) none.
func TestSplitWaitsForTheNewCommunicator(t *testing.T) {
	b := standinBackend(t)
	const n = 4
	rs := form(t, b, n)
	colors := []int{0, 1, 0, gpu.NoColor}
	keys := []int{5, 0, 1, 0}
	subs := make([]gpu.Comm, n)
	each(t, rs, func(r int, x *rankState) error {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		sub, err := x.c.(gpu.Splitter).Split(ctx, colors[r], keys[r])
		subs[r] = sub
		if err != nil {
			return fmt.Errorf("rank %d: %w", r, err)
		}
		return nil
	})
	for r, want := range []struct{ rank, size int }{{1, 2}, {0, 1}, {0, 2}, {-1, 0}} {
		switch {
		case want.rank < 0 && subs[r] != nil:
			t.Errorf("rank %d (no color) got a communicator", r)
		case want.rank >= 0 && subs[r] == nil:
			t.Errorf("rank %d of color %d got no communicator", r, colors[r])
		case want.rank >= 0 && (subs[r].Rank() != want.rank || subs[r].Size() != want.size):
			t.Errorf("rank %d: rank %d of %d in its split, want %d of %d", r, subs[r].Rank(), subs[r].Size(), want.rank, want.size)
		}
	}
	// The sub-communicators work: an allreduce over ranks 0 and 2.
	if subs[0] != nil && subs[2] != nil {
		ps := []gpu.Ptr{alloc(t, rs[0].dev, 4), alloc(t, rs[2].dev, 4)}
		putF32(mem(ps[0], 4), 1)
		putF32(mem(ps[1], 4), 2)
		pair := []*rankState{{rs[0].dev, rs[0].s, subs[0]}, {rs[2].dev, rs[2].s, subs[2]}}
		each(t, pair, func(i int, x *rankState) error {
			return x.c.AllReduce(ps[i], ps[i], 1, gpu.Float32, gpu.Sum, x.s)
		})
		for i, x := range pair {
			sync1(t, x.s)
			if got := f32s(mem(ps[i], 4))[0]; got != 3 {
				t.Errorf("split allreduce on its rank %d: %v, want 3", i, got)
			}
		}
		each(t, pair, func(_ int, x *rankState) error { return x.c.Destroy() })
	}
	if subs[1] != nil {
		if err := subs[1].Destroy(); err != nil {
			t.Error(err)
		}
	}
	destroy(t, rs)
}

// The watchdog polls AsyncError while halt may abort the communicator on another goroutine: the
// poll must never reach NCCL with a communicator that abort freed.
func TestAsyncErrorRacesAbort(t *testing.T) {
	b := standinBackend(t)
	for i := range 60 {
		c := form(t, b, 1)[0].c
		done := make(chan error)
		go func() {
			deadline := time.Now().Add(10 * time.Second)
			for time.Now().Before(deadline) {
				if err := c.AsyncError(); err != nil {
					done <- err
					return
				}
			}
			done <- errors.New("no error 10 s after the abort")
		}()
		time.Sleep(time.Duration(i%3) * time.Millisecond)
		if err := c.Abort(); err != nil {
			t.Fatal(err)
		}
		if err := <-done; !errors.Is(err, gpu.ErrAborted) {
			t.Fatalf("round %d: AsyncError racing Abort: %v, want ErrAborted", i, err)
		}
	}
}

// Destroy waits for its finalize to settle; an abort meanwhile (halt, on a lost peer) ends the
// wait, and nothing reaches NCCL with the freed communicator.
func TestSettleSeesAbort(t *testing.T) {
	b := standinBackend(t)
	rs := form(t, b, 2)
	x := rs[0]
	p := alloc(t, x.dev, 64)
	if err := x.c.AllReduce(p, p, 16, gpu.Float32, gpu.Sum, x.s); err != nil {
		t.Fatal(err)
	}
	done := make(chan error)
	go func() { done <- x.c.Destroy() }()
	time.Sleep(100 * time.Millisecond) // Destroy is settling its finalize, which waits for the allreduce
	if err := x.c.Abort(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, gpu.ErrAborted) {
			t.Errorf("Destroy ended by an abort: %v, want ErrAborted", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Destroy still settling 10 s after the abort")
	}
	if err := x.c.AllReduce(p, p, 16, gpu.Float32, gpu.Sum, x.s); !errors.Is(err, gpu.ErrAborted) {
		t.Errorf("allreduce after abort: %v, want ErrAborted", err)
	}
	sync1(t, x.s)
	if err := rs[1].c.Abort(); err != nil {
		t.Fatal(err)
	}
}

// yielding is a Comm whose group calls let the scheduler move the goroutine between them, and
// record the OS thread each ran on.
type yielding struct {
	gpu.Comm
	mu      sync.Mutex
	threads map[int]bool // OS threads the calls of the current group ran on
	spread  int          // groups whose calls ran on more than one thread
}

func (y *yielding) on() {
	y.mu.Lock()
	y.threads[syscall.Gettid()] = true
	y.mu.Unlock()
	runtime.Gosched()
}

func (y *yielding) GroupStart() error {
	y.mu.Lock()
	y.threads = map[int]bool{}
	y.mu.Unlock()
	y.on()
	return y.Comm.GroupStart()
}

func (y *yielding) Send(b gpu.Ptr, n int, t gpu.DataType, p int, s gpu.Stream) error {
	y.on()
	return y.Comm.Send(b, n, t, p, s)
}

func (y *yielding) Recv(b gpu.Ptr, n int, t gpu.DataType, p int, s gpu.Stream) error {
	y.on()
	return y.Comm.Recv(b, n, t, p, s)
}

func (y *yielding) GroupEnd() error {
	y.on()
	y.mu.Lock()
	if len(y.threads) > 1 {
		y.spread++
	}
	y.mu.Unlock()
	return y.Comm.GroupEnd()
}

// NCCL's group state is per OS thread: a group's calls must all run on the thread that started
// it, whatever the Go scheduler does meanwhile (here: goroutines busy on every P, and a yield
// between calls).
func TestAllToAllGroupOnOneThread(t *testing.T) {
	b := standinBackend(t)
	const n = 3
	rs := form(t, b, n)
	stop := make(chan struct{})
	var busy sync.WaitGroup
	for range runtime.GOMAXPROCS(0) + 1 {
		busy.Add(1)
		go func() {
			defer busy.Done()
			for {
				select {
				case <-stop:
					return
				default:
					runtime.Gosched()
				}
			}
		}()
	}
	defer func() { close(stop); busy.Wait() }()
	ys := make([]*yielding, n)
	bufs := make([][2]gpu.Ptr, n)
	for r, x := range rs {
		ys[r] = &yielding{Comm: x.c}
		bufs[r] = [2]gpu.Ptr{alloc(t, x.dev, 4*n), alloc(t, x.dev, 4*n)}
	}
	ones := make([]int, n)
	displs := make([]int, n)
	for p := range n {
		ones[p], displs[p] = 1, p
	}
	for round := range 20 {
		for r := range rs {
			putF32(mem(bufs[r][0], 4*n), float32(100*round+r), float32(100*round+r), float32(100*round+r))
		}
		each(t, rs, func(r int, x *rankState) error {
			err := gpu.AllToAll(ys[r], bufs[r][0], ones, displs, bufs[r][1], ones, displs, gpu.Float32, x.s)
			if err != nil {
				return fmt.Errorf("round %d, rank %d: %w", round, r, err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := x.s.Synchronize(ctx); err != nil {
				return fmt.Errorf("round %d, rank %d: %w", round, r, err)
			}
			for p, v := range f32s(mem(bufs[r][1], 4*n)) {
				if v != float32(100*round+p) {
					return fmt.Errorf("round %d, rank %d: got %v from rank %d", round, r, v, p)
				}
			}
			return nil
		})
	}
	for r, y := range ys {
		if y.spread > 0 {
			t.Errorf("rank %d: %d of 20 groups ran on more than one OS thread", r, y.spread)
		}
	}
	destroy(t, rs)
}

// Every call gives the calling thread its current device back (it may be the Python thread,
// whose device is torch's), and clean-up runs with the communicator's device current: the
// stand-in reports finalize, destroy or abort made on another device. Ranks 1 and 2 show it,
// their goroutines' threads being on device 0.
func TestCleanUpOnTheCommunicatorsDevice(t *testing.T) {
	b := standinBackend(t)
	destroy(t, form(t, b, 3))
	each(t, form(t, b, 3), func(_ int, x *rankState) error {
		return errors.Join(x.c.Abort(), x.s.Destroy())
	})
}

// loadedChild marks the process of TestLoadedRuntimeIsPreferred.
const loadedChild = "KOLO_NCCL_TEST_LOADED_RUNTIME"

// A CUDA runtime already in the process (torch's; here the stand-in's, which its libnccl
// brought in) is the one kolo binds, even where a newer one is on the loader's path: two
// runtimes in one process do not share devices, streams or memory. The newer one here is a decoy
// without CUDA's functions.
func TestLoadedRuntimeIsPreferred(t *testing.T) {
	if os.Getenv(loadedChild) == "" {
		standinBackend(t) // builds the stand-in
		decoy := fakeLib(t, "libcudart.so.13", "int kolo_decoy(void) { return 0; }\n")
		cmd := exec.Command(os.Args[0], "-test.run=^TestLoadedRuntimeIsPreferred$", "-test.v")
		cmd.Env = append(os.Environ(), loadedChild+"="+standin.libs.NCCL, "LD_LIBRARY_PATH="+filepath.Dir(decoy))
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS: TestLoadedRuntimeIsPreferred") {
			t.Fatalf("%v:\n%s", err, out)
		}
		return
	}
	b, err := open(Options{NCCLPaths: []string{os.Getenv(loadedChild)}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.PCIBusID(0); err != nil {
		t.Fatal(err)
	}
}

// procChild marks a rank process of TestStandinRanksInProcesses: its value is
// "rank/size/hex id/lose", lose naming a rank killed while the others are in the second
// allreduce.
const procChild = "KOLO_NCCL_TEST_RANK"

// Ranks in separate processes meet through the stand-in's files; a rank killed with -9 inside a
// collective leaves the others blocked in it until they abort.
func TestStandinRanksInProcesses(t *testing.T) {
	if v := os.Getenv(procChild); v != "" {
		rankProcess(t, v)
		return
	}
	b := standinBackend(t)
	for _, tc := range []struct {
		name    string
		n, lose int
	}{{"2 ranks", 2, -1}, {"3 ranks", 3, -1}, {"3 ranks, rank 1 killed", 3, 1}} {
		t.Run(tc.name, func(t *testing.T) {
			id, err := b.NewUniqueID()
			if err != nil {
				t.Fatal(err)
			}
			cmds := make([]*exec.Cmd, tc.n)
			outs := make([]strings.Builder, tc.n)
			for r := range tc.n {
				cmds[r] = exec.Command(os.Args[0], "-test.run=^TestStandinRanksInProcesses$", "-test.v")
				cmds[r].Env = append(os.Environ(), fmt.Sprintf("%s=%d/%d/%x/%d", procChild, r, tc.n, id[:], tc.lose),
					"LD_LIBRARY_PATH="+standin.libs.Dir)
				cmds[r].Stdout, cmds[r].Stderr = &outs[r], &outs[r]
				if err := cmds[r].Start(); err != nil {
					t.Fatal(err)
				}
			}
			done := make(chan error, tc.n)
			for r := range tc.n {
				go func() {
					err := cmds[r].Wait()
					if err == nil && !strings.Contains(outs[r].String(), "--- PASS") {
						err = errors.New("no test passed")
					}
					if r == tc.lose {
						err = nil // it killed itself
					}
					done <- err
				}()
			}
			timeout := time.After(60 * time.Second)
			for range tc.n {
				select {
				case err := <-done:
					if err != nil {
						for r := range tc.n {
							t.Logf("rank %d:\n%s", r, outs[r].String())
						}
						t.Fatal(err)
					}
				case <-timeout:
					for _, c := range cmds {
						c.Process.Kill()
					}
					t.Fatal("ranks still running after 60 s")
				}
			}
		})
	}
}

// rankProcess is one rank of TestStandinRanksInProcesses, loading the stand-in by the loader's
// search path (LD_LIBRARY_PATH), as a user points kolo at an NCCL.
func rankProcess(t *testing.T, spec string) {
	var rank, size, lose int
	var hexID string
	if _, err := fmt.Sscanf(strings.ReplaceAll(spec, "/", " "), "%d %d %s %d", &rank, &size, &hexID, &lose); err != nil {
		t.Fatal(err)
	}
	raw, err := hex.DecodeString(hexID)
	if err != nil || len(raw) != gpu.UniqueIDBytes {
		t.Fatalf("id %q: %v", hexID, err)
	}
	var id gpu.UniqueID
	copy(id[:], raw)
	b, err := open(Options{CallTimeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// Each process's device 0: on one host, as ranks on separate GPUs (the stand-in has no
	// notion of a shared device across processes).
	dev, err := b.Device(0)
	if err != nil {
		t.Fatal(err)
	}
	s, err := dev.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := b.NewComm(ctx, dev, id, size, rank)
	if err != nil {
		t.Fatal(err)
	}
	p := alloc(t, dev, 4)
	putF32(mem(p, 4), float32(rank+1))
	if err := c.AllReduce(p, p, 1, gpu.Float32, gpu.Sum, s); err != nil {
		t.Fatal(err)
	}
	sync1(t, s)
	if got, want := f32s(mem(p, 4))[0], float32(size*(size+1)/2); got != want {
		t.Fatalf("allreduce: %v, want %v", got, want)
	}
	if rank == lose {
		// Killed before its part of the second allreduce ran (once enqueued, its stream's
		// thread may run it before the signal lands): the others are inside it.
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
	}
	if err := c.AllReduce(p, p, 1, gpu.Float32, gpu.Sum, s); err != nil {
		t.Fatal(err)
	}
	if lose < 0 {
		sync1(t, s)
		if err := c.Destroy(); err != nil {
			t.Fatal(err)
		}
		return
	}
	short, cancel2 := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel2()
	if err := s.Synchronize(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the allreduce with rank %d killed: %v, want it blocked", lose, err)
	}
	if err := c.Abort(); err != nil {
		t.Fatal(err)
	}
	sync1(t, s)
}

// noSplitChild marks the process of TestStandinWithoutSplit; its value is the library's path.
const noSplitChild = "KOLO_NCCL_TEST_NO_SPLIT"

// An NCCL without ncclCommSplit (before 2.18) binds, and its communicators are no Splitters:
// the engine forms process sets' communicators from ids of their own. In a process of its own,
// as the library differs from the other tests'.
func TestStandinWithoutSplit(t *testing.T) {
	if lib := os.Getenv(noSplitChild); lib != "" {
		b, err := open(Options{NCCLPaths: []string{lib}, CUDAPaths: []string{filepath.Join(filepath.Dir(lib), "libcudart.so.12")}})
		if err != nil {
			t.Fatal(err)
		}
		if b.split || b.Version() != (gpu.Version{Major: 2, Minor: 17, Patch: 1}) {
			t.Fatalf("NCCL %s, split %v: want 2.17.1 without split", b.Version(), b.split)
		}
		rs := form(t, b, 2)
		for r, x := range rs {
			if _, ok := x.c.(gpu.Splitter); ok {
				t.Errorf("rank %d: a Splitter on an NCCL without ncclCommSplit", r)
			}
		}
		destroy(t, rs)
		return
	}
	standinBackend(t) // the environment, and a report check
	l, err := ncclstandin.Build(t.TempDir(), ncclstandin.Variant{Version: 21701, NoSplit: true})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestStandinWithoutSplit$", "-test.v")
	cmd.Env = append(os.Environ(), noSplitChild+"="+l.NCCL)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestStandinWithoutSplit") {
		t.Fatalf("%v:\n%s", err, out)
	}
}

// An abort (halt, on another goroutine) while a group is open waits for the group's end: NCCL
// would otherwise launch the group's operations on the communicator the abort freed.
func TestAbortWaitsForAnOpenGroup(t *testing.T) {
	b := standinBackend(t)
	rs := form(t, b, 2)
	x := rs[0]
	p := alloc(t, x.dev, 4)
	aborted := make(chan error, 1)
	_ = gpu.Group(x.c, func() error {
		if err := x.c.Send(p, 1, gpu.Float32, 1, x.s); err != nil {
			return err
		}
		go func() { aborted <- x.c.Abort() }()
		time.Sleep(100 * time.Millisecond) // the abort waits for the group's end, or (were it not to) is done
		return nil
	}) // its error, if any, is the abort's
	select {
	case err := <-aborted:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the abort still waiting 10 s after the group ended")
	}
	sync1(t, x.s)
	if err := rs[1].c.Abort(); err != nil {
		t.Fatal(err)
	}
}
