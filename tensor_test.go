package kolo

import (
	"testing"

	"github.com/kolo-dl/kolo/internal/dtype"
)

// Every dtype has a Go element type, and Of/As agree with it.
func TestDTypeOfCoversEveryDType(t *testing.T) {
	got := map[dtype.DType]bool{
		DTypeOf[uint8](): true, DTypeOf[int8](): true, DTypeOf[int16](): true, DTypeOf[int32](): true,
		DTypeOf[int64](): true, DTypeOf[float32](): true, DTypeOf[float64](): true,
		DTypeOf[Float16](): true, DTypeOf[BFloat16](): true,
	}
	for _, d := range dtype.All {
		if !got[d] {
			t.Errorf("no Go element type maps to %v", d)
		}
	}
	if len(got) != len(dtype.All) {
		t.Errorf("DTypeOf gives %d distinct dtypes, dtype.All has %d", len(got), len(dtype.All))
	}
}

func TestOfAsInt16(t *testing.T) {
	s := []int16{-32768, -1, 0, 1, 32767}
	tn := Of(s)
	if tn.DType != dtype.Int16 || len(tn.Data) != 10 || tn.Shape[0] != 5 {
		t.Fatalf("Of(int16 x5) = %v %d bytes shape %v", tn.DType, len(tn.Data), tn.Shape)
	}
	back := As[int16](tn)
	back[2] = 7
	if s[2] != 7 || len(back) != len(s) {
		t.Fatalf("As[int16] does not view the same memory: %v vs %v", back, s)
	}
}
