package kolo

import (
	"errors"
	"strings"
	"testing"

	"github.com/kolo-dl/kolo/internal/dtype"
)

// A shape whose byte size overflows int64 is refused, not wrapped around: [1<<62, 4] of float32
// is 1<<66 bytes, which wrapping int64 arithmetic makes 0, the length of an empty Data.
func TestTensorCheckRefusesSizesPastInt64(t *testing.T) {
	for _, shape := range [][]int64{{1 << 62, 4}, {1 << 62}, {1 << 31, 1 << 31, 1 << 31}} {
		err := Tensor{Data: []byte{}, DType: dtype.Float32, Shape: shape}.check()
		if !errors.Is(err, dtype.ErrTooLarge) {
			t.Errorf("shape %v of float32, no data: check() = %v, want an error matching %q", shape, err, dtype.ErrTooLarge)
		}
	}
	// A zero dimension makes the others irrelevant: no elements, no bytes.
	if err := (Tensor{Data: []byte{}, DType: dtype.Float32, Shape: []int64{1 << 62, 0, 4}}).check(); err != nil {
		t.Errorf("empty tensor of shape [1<<62 0 4]: check() = %v", err)
	}
	if err := (Tensor{Data: make([]byte, 24), DType: dtype.Float32, Shape: []int64{2, 3}}).check(); err != nil {
		t.Errorf("2x3 float32 in 24 bytes: check() = %v", err)
	}
	err := Tensor{Data: make([]byte, 4), DType: dtype.Float32, Shape: []int64{2, -1}}.check()
	if err == nil || !strings.Contains(err.Error(), "negative dimension in shape [2 -1]") {
		t.Errorf("shape [2 -1]: check() = %v, want a negative dimension", err)
	}
	err = Tensor{Data: make([]byte, 8), DType: dtype.Float32, Shape: []int64{3}}.check()
	if err == nil || !strings.Contains(err.Error(), "needs 12 bytes, data has 8") {
		t.Errorf("3 float32 in 8 bytes: check() = %v", err)
	}
}

// Init reads KOLO_TCP_FULL_MESH through its declaration: a value that is neither on nor off
// fails it, naming the variable; an on/off word in any case is taken.
func TestInitReadsTCPFullMesh(t *testing.T) {
	t.Setenv("KOLO_TCP_FULL_MESH", "maybe")
	err := Init()
	if err == nil {
		_ = Shutdown()
	}
	if err == nil || !strings.Contains(err.Error(), `KOLO_TCP_FULL_MESH="maybe"`) {
		t.Errorf("Init with KOLO_TCP_FULL_MESH=maybe: %v", err)
	}
	t.Setenv("KOLO_TCP_FULL_MESH", " On ")
	if err := Init(); err != nil {
		t.Fatalf("Init with KOLO_TCP_FULL_MESH=On: %v", err)
	}
	if err := Shutdown(); err != nil {
		t.Fatal(err)
	}
}
