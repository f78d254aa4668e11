package main

import (
	"errors"
	"math"
	"testing"
	"unsafe"

	"github.com/kolo-dl/kolo/dtype"
)

var errTest = errors.New("test: rejected")

// tensor must never build a slice longer than the caller's memory, whatever shape it is given:
// malformed shapes get an empty view, which kolo's checks then reject with a message.
func TestTensorViews(t *testing.T) {
	buf := make([]float32, 6)
	p := unsafe.Pointer(&buf[0])
	for _, tc := range []struct {
		name      string
		p         unsafe.Pointer
		dt        int
		shape     []int64
		wantBytes int
		wantErr   bool
	}{
		{"2x3 float32", p, 7, []int64{2, 3}, 24, false},
		{"scalar", p, 7, nil, 4, false},
		{"empty with null pointer", nil, 7, []int64{0, 3}, 0, false},
		{"negative dim", p, 7, []int64{-2, 3}, 0, false},
		{"overflowing shape", p, 7, []int64{math.MaxInt64 / 2, 4}, 0, false},
		{"invalid dtype", p, 99, []int64{2}, 0, false},
		{"null pointer with data", nil, 7, []int64{2}, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tensor(tc.p, dtype.DType(tc.dt), tc.shape)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if err == nil && len(got.Data) != tc.wantBytes {
				t.Errorf("view of %d bytes, want %d", len(got.Data), tc.wantBytes)
			}
		})
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
