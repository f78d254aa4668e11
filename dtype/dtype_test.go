package dtype

import (
	"errors"
	"math"
	"testing"
)

func TestParseRoundTrip(t *testing.T) {
	for _, d := range All {
		got, err := Parse(d.String())
		if err != nil || got != d {
			t.Errorf("Parse(%q) = %v, %v; want %v", d.String(), got, err, d)
		}
		if d.Size() == 0 || !d.Valid() {
			t.Errorf("%v: size %d valid %v", d, d.Size(), d.Valid())
		}
	}
}

func TestParseRejects(t *testing.T) {
	for _, s := range []string{"", "float128", "complex64"} {
		if _, err := Parse(s); err == nil {
			t.Errorf("Parse(%q) accepted", s)
		}
	}
	if Invalid.Valid() || DType(200).Valid() || DType(200).Size() != 0 {
		t.Error("out-of-range dtype treated as valid")
	}
}

func TestBytes(t *testing.T) {
	for _, tc := range []struct {
		d     DType
		shape []int64
		want  int64
	}{
		{Float32, nil, 4},
		{Float32, []int64{}, 4},
		{Float64, []int64{2, 3}, 48},
		{Uint8, []int64{7}, 7},
		{Float32, []int64{0}, 0},
		{Float32, []int64{1 << 62, 0, 1 << 62}, 0}, // no elements, however large the other dims
		{Int64, []int64{1 << 30, 1 << 29}, 1 << 62},
		{Uint8, []int64{math.MaxInt64}, math.MaxInt64},
		{Invalid, []int64{5}, 0},
	} {
		got, err := Bytes(tc.d, tc.shape)
		if err != nil || got != tc.want {
			t.Errorf("Bytes(%v, %v) = %d, %v; want %d", tc.d, tc.shape, got, err, tc.want)
		}
	}
}

// Sizes past int64 and negative dimensions are errors, never wrapped-around numbers: [1<<62, 4]
// of float32 is 1<<66 bytes, which int64 arithmetic makes 0.
func TestBytesRefuses(t *testing.T) {
	for _, tc := range []struct {
		d     DType
		shape []int64
		want  error
	}{
		{Float32, []int64{1 << 62, 4}, ErrTooLarge},
		{Float32, []int64{1 << 61}, ErrTooLarge},
		{Uint8, []int64{math.MaxInt64, 2}, ErrTooLarge},
		{Int64, []int64{1 << 30, 1 << 30}, ErrTooLarge}, // exactly 1<<63
		{Float64, []int64{1 << 31, 1 << 31, 1 << 31}, ErrTooLarge},
		{Float32, []int64{2, -1}, ErrNegativeDim},
		{Float32, []int64{0, -1}, ErrNegativeDim},
	} {
		got, err := Bytes(tc.d, tc.shape)
		if !errors.Is(err, tc.want) || got != 0 {
			t.Errorf("Bytes(%v, %v) = %d, %v; want an error matching %q", tc.d, tc.shape, got, err, tc.want)
		}
	}
}
