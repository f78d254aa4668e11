package main

import (
	"errors"
	"math"
	"strings"
	"testing"
	"unsafe"

	"github.com/kolo-dl/kolo/dtype"
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
