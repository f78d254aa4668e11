package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"unsafe"

	"github.com/kolo-dl/kolo"
	"github.com/kolo-dl/kolo/internal/dtype"
	"github.com/kolo-dl/kolo/internal/engine"
	"github.com/kolo-dl/kolo/internal/engine/negotiate"
)

var errTest = errors.New("test: rejected")

// cTensor must never build a slice longer than the caller's memory, whatever shape it is given:
// malformed shapes are refused, naming the bad dimension.
func TestTensorViews(t *testing.T) {
	buf := make([]float32, 6)
	p := unsafe.Pointer(&buf[0])
	for _, tc := range []struct {
		name      string
		p         unsafe.Pointer
		shape     []int64
		wantBytes int
		wantErr   string
	}{
		{"2x3 float32", p, []int64{2, 3}, 24, ""},
		{"scalar", p, nil, 4, ""},
		{"empty with null pointer", nil, []int64{0, 3}, 0, ""},
		{"empty with a negative dim after the zero", nil, []int64{0, -3}, 0, "argument shape[1] = -3"},
		{"negative dim", p, []int64{-2, 3}, 0, "argument shape[0] = -2"},
		{"overflowing shape", p, []int64{math.MaxInt64 / 2, 4}, 0, "argument shape = [4611686018427387903 4]"},
		{"null pointer with data", nil, []int64{2}, 0, "argument in = NULL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := cTensor("in", whole, tc.p, dtype.Float32, "shape", 0, tc.shape)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("err = %v", err)
			}
			if len(got.Data) != tc.wantBytes {
				t.Errorf("view of %d bytes, want %d", len(got.Data), tc.wantBytes)
			}
		})
	}
}

// The checks run for every op and every member of a group: passing ones allocate nothing (an
// argument error, with its name and index, is built and formatted only when one is refused).
func TestArgumentChecksDoNotAllocate(t *testing.T) {
	buf := make([]float32, 6)
	p := unsafe.Pointer(&buf[0])
	shapes := []int64{2, 3}
	ranks := []int32{0, 1}
	if n := testing.AllocsPerRun(100, func() {
		for i := range 4 {
			if _, err := cDType("dtypes", i, 7); err != nil {
				t.Fatal(err)
			}
			if _, err := cTensor("ins", i, p, dtype.Float32, "shapes", 2*i, shapes); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := cArray[int32]("ranks", "n", unsafe.Pointer(&ranks[0]), len(ranks)); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("%v allocations per run of valid checks, want 0", n)
	}
}

// An element's index is formatted into the message as the C argument numbers it.
func TestArgErrorNamesTheElement(t *testing.T) {
	for _, tc := range []struct {
		err  *argError
		want string
	}{
		{&argError{"dt", whole, 99, "bad"}, "argument dt = 99: bad"},
		{&argError{"dtypes", 3, 99, "bad"}, "argument dtypes[3] = 99: bad"},
		{&argError{"ins", 0, null, "bad"}, "argument ins[0] = NULL: bad"},
	} {
		if got := tc.err.Error(); got != tc.want {
			t.Errorf("Error() = %q, want %q", got, tc.want)
		}
	}
}

func TestHandleTable(t *testing.T) {
	before := kolo_handles()
	h := issued(&op{err: errTest})
	if h >= 0 {
		t.Fatalf("an op that failed at once got handle %d, want a negative one", h)
	}
	if st := kolo_poll(-h); st != statusFailed {
		t.Errorf("poll = %d, want failed", st)
	}
	if st := kolo_wait(-h, 1000, 1); st != statusFailed {
		t.Errorf("wait = %d, want failed", st)
	}
	if n := kolo_error(-h, nil, 0); int(n) != len(errTest.Error()) {
		t.Errorf("error length %d, want %d", n, len(errTest.Error()))
	}
	kolo_release(-h)
	if kolo_poll(-h) != statusUnknown || kolo_handles() != before {
		t.Error("released handle still known")
	}
}

// kolo_error_kind tells a binding what to raise: the ranks' disagreement (errors.Is kolo.ErrMismatch,
// wrapped or not) apart from a failure and from this rank's refusal.
func TestErrorKinds(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want int
	}{
		{"failed", errTest, errorFailed},
		{"mismatch", &engine.OpError{Msg: "dtypes differ", Cause: negotiate.Mismatch}, errorMismatch},
		{"wrapped mismatch", fmt.Errorf("process set 1: %w", &engine.OpError{Cause: negotiate.Mismatch}), errorMismatch},
		{"a rank ended", &engine.OpError{Msg: "rank 1 ended", Ended: []int{1}}, errorFailed},
		{"refused here", &kolo.ArgumentError{Err: errTest}, errorArgument},
		{"device path unavailable", kolo.ErrDeviceUnavailable, errorUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &call{done: make(chan struct{}), err: tc.err}
			close(c.done)
			h := -issued(&op{call: c}) // negative: failed at once
			defer kolo_release(h)
			if k := kolo_error_kind(h); int(k) != tc.want {
				t.Errorf("kolo_error_kind = %d, want %d", k, tc.want)
			}
		})
	}
}

// testOp is kolo_op as Go lays it out: tests build the blocks kolo_enqueue reads with it.
type testOp struct {
	in, out                                                                      unsafe.Pointer
	prescale, postscale                                                          float64
	kind, dt, ndim, reduceOp, root, nsplits, processSet, device, waitUS, nameLen int32
}

// head is h's bytes, as a C caller lays out its kolo_op.
func (h testOp) head() []byte {
	return append([]byte(nil), unsafe.Slice((*byte)(unsafe.Pointer(&h)), unsafe.Sizeof(h))...)
}

// opBlock is the block kolo_enqueue reads for h, with shape, splits (nil: none, nsplits -1) and
// name after it, and h's counts set from them.
func opBlock(h testOp, shape, splits []int64, name string) []byte {
	h.ndim, h.nsplits, h.nameLen = int32(len(shape)), -1, int32(len(name))
	if splits != nil {
		h.nsplits = int32(len(splits))
	}
	b := h.head()
	for _, v := range append(append([]int64(nil), shape...), splits...) {
		b = binary.NativeEndian.AppendUint64(b, uint64(v))
	}
	return append(b, name...)
}

// enqueueBlock calls kolo_enqueue with the first size bytes of b, as a C caller would (_Ctype_int
// is cgo's name for C.int, which a test file cannot spell).
func enqueueBlock(b []byte, size int) int64 {
	return int64(kolo_enqueue(unsafe.Pointer(&b[0]), _Ctype_int(size)))
}

// The block's head is the size of the C struct, and every field lands where opArgs reads it.
func TestOpBlock(t *testing.T) {
	if got := int(unsafe.Sizeof(testOp{})); got != opHeadBytes {
		t.Fatalf("testOp has %d bytes, kolo_op %d", got, opHeadBytes)
	}
	in, out := new(float32), new(float32)
	b := opBlock(testOp{in: unsafe.Pointer(in), out: unsafe.Pointer(out), prescale: 0.5, postscale: 3, kind: 4,
		dt: 7, reduceOp: 5, root: 1, processSet: 2, device: 3, waitUS: 50}, []int64{6, 7}, []int64{1, 2, 3}, "grad")
	a, err := opArgs(unsafe.Pointer(&b[0]), len(b))
	if err != nil {
		t.Fatal(err)
	}
	got := fmt.Sprintf("%v %v %v %v %d %d %d %d %d %d %d",
		a.in == unsafe.Pointer(in), a.out == unsafe.Pointer(out), a.prescale, a.postscale, a.kind, a.dtype,
		a.op, a.root, a.processSet, a.device, a.waitUS)
	if want := "true true 0.5 3 4 7 5 1 2 3 50"; got != want {
		t.Errorf("fields %s, want %s", got, want)
	}
	shape, _ := cInt64s("shape", "ndim", a.shape, a.ndim)
	splits, _ := cInt64s("splits", "nsplits", a.splits, a.nsplits)
	name, _ := cString("name", "nameLen", a.name, a.nameLen)
	if got := fmt.Sprintf("%v %v %s", shape, splits, name); got != "[6 7] [1 2 3] grad" {
		t.Errorf("arrays %s, want [6 7] [1 2 3] grad", got)
	}
	if a, err := opArgs(unsafe.Pointer(&b[0]), len(b)+1); err != nil || a.nameLen != 4 {
		t.Errorf("a block longer than its op: %v, name of %d bytes", err, a.nameLen)
	}
	none := opBlock(testOp{}, nil, nil, "")
	if a, err := opArgs(unsafe.Pointer(&none[0]), len(none)); err != nil || a.splits != nil {
		t.Errorf("nsplits -1: %v, splits %v, want none", err, a.splits)
	}
}

// kolo_enqueue refuses a block that does not hold what it declares, naming the field.
func TestOpBlockRefusals(t *testing.T) {
	lockThread(t)
	valid := testOp{kind: kindAllreduce, dt: 7, reduceOp: 1, prescale: 1, postscale: 1, device: -1}
	short := func(b []byte, n int) func() ([]byte, int) { return func() ([]byte, int) { return b, n } }
	whole := func(h testOp) func() ([]byte, int) { return func() ([]byte, int) { return h.head(), opHeadBytes } }
	for _, tc := range []struct {
		name  string
		block func() ([]byte, int) // the block and the size passed with it
		want  string
	}{
		{"shorter than the head", short(opBlock(valid, nil, nil, ""), 71), "argument size = 71: shorter than a kolo_op (72 bytes)"},
		{"negative size", short(opBlock(valid, nil, nil, ""), -1), "argument size = -1"},
		{"shape cut off", short(opBlock(valid, []int64{2, 3}, nil, ""), 80), "argument size = 80: the op's shape, splits and name need 88"},
		{"name cut off", short(opBlock(valid, nil, nil, "grad"), 75), "argument size = 75: the op's shape, splits and name need 76"},
		{"negative ndim", whole(testOp{ndim: -2}), "argument ndim = -2"},
		{"negative name length", whole(testOp{nameLen: -1}), "argument nameLen = -1"},
		{"nsplits below -1", whole(testOp{nsplits: -2}), "argument nsplits = -2"},
		{"negative wait", whole(testOp{waitUS: -5}), "argument waitUS = -5"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lockThread(t)
			b, size := tc.block()
			if msg := handleError(t, enqueueBlock(b, size)); !strings.Contains(msg, "kolo_enqueue: "+tc.want) {
				t.Errorf("error %q, want it to contain %q", msg, "kolo_enqueue: "+tc.want)
			}
		})
	}
}

// initWorld joins a world of this one process for the test, and leaves it at the end.
func initWorld(t *testing.T) {
	t.Helper()
	h := kolo_init_async(nil, 0)
	waitFor(t, func() bool { return kolo_wait(h, 10000, 0) != statusPending })
	if st := kolo_poll(h); st != statusOK {
		t.Fatalf("init: status %d, error %v", st, lookup(int64(h)).failure())
	}
	kolo_release(h)
	t.Cleanup(func() {
		h := kolo_shutdown_async()
		waitFor(t, func() bool { return kolo_wait(h, 10000, 0) != statusPending })
		if err := lookup(int64(h)).failure(); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		kolo_release(h)
	})
}

// A synchronous call (waitUS > 0) waits in kolo_enqueue: an op with nothing to fetch that completed
// returns 0 with its handle released; one with a result returns its handle, completed. An async
// call returns its handle at once.
func TestEnqueueWaitsAtOnce(t *testing.T) {
	lockThread(t)
	initWorld(t)
	before := kolo_handles()
	x := []float32{1, 2, 3}
	p := unsafe.Pointer(&x[0])
	op := testOp{in: p, out: p, kind: kindAllreduce, dt: 7, reduceOp: 1, prescale: 2, postscale: 1, device: -1,
		waitUS: 10_000_000}
	sync := opBlock(op, []int64{3}, nil, "sync")
	if h := enqueueBlock(sync, len(sync)); h != 0 {
		t.Fatalf("synchronous allreduce returned %d, want 0 (error %v)", h, lookup(h).failure())
	}
	if fmt.Sprint(x) != "[2 4 6]" || kolo_handles() != before {
		t.Errorf("after it: %v (want [2 4 6]), %d handles (want %d)", x, kolo_handles(), before)
	}
	op.kind, op.out = kindAllgather, nil
	gather := opBlock(op, []int64{3}, nil, "gather")
	h := enqueueBlock(gather, len(gather))
	if h <= 0 || kolo_poll(_Ctype_int64_t(h)) != statusOK {
		t.Fatalf("synchronous allgather: handle %d, want a completed one", h)
	}
	kolo_release(_Ctype_int64_t(h))
	op.kind, op.out, op.waitUS = kindAllreduce, p, 0
	async := opBlock(op, []int64{3}, nil, "async")
	h = enqueueBlock(async, len(async))
	if h <= 0 {
		t.Fatalf("async allreduce: handle %d", h)
	}
	if st := kolo_wait(_Ctype_int64_t(h), 10_000_000, 1); st != statusOK {
		t.Fatalf("async allreduce: status %d", st)
	}
}

// What a small op allocates in the C ABI and below it, against a budget: the count is exact where
// a timing is noise. Lower the budget when a change saves an allocation.
func TestSmallOpAllocations(t *testing.T) {
	lockThread(t)
	initWorld(t)
	x := []float32{1}
	p := unsafe.Pointer(&x[0])
	op := testOp{in: p, out: p, kind: kindAllreduce, dt: 7, reduceOp: 1, prescale: 1, postscale: 1, device: -1,
		waitUS: 10_000_000}
	sync := opBlock(op, []int64{1}, nil, "sync")
	op.waitUS = 0
	async := opBlock(op, []int64{1}, nil, "async")
	for _, tc := range []struct {
		name   string
		budget float64
		op     func()
	}{
		{"synchronous allreduce (one call)", 16, func() {
			if h := enqueueBlock(sync, len(sync)); h != 0 {
				t.Fatalf("returned %d, want 0", h)
			}
		}},
		{"async allreduce and kolo_wait", 16, func() {
			h := enqueueBlock(async, len(async))
			if st := kolo_wait(_Ctype_int64_t(h), 10_000_000, 1); st != statusOK {
				t.Fatalf("status %d", st)
			}
		}},
	} {
		if n := testing.AllocsPerRun(200, tc.op); n > tc.budget {
			t.Errorf("%s: %v allocations per op, budget %v", tc.name, n, tc.budget)
		} else {
			t.Logf("%s: %v allocations per op (budget %v)", tc.name, n, tc.budget)
		}
	}
}
