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

// The numeric values are the C ABI and wire format: they may only be appended to.
func TestValuesAndSizes(t *testing.T) {
	for _, tc := range []struct {
		d    DType
		code int
		size int
	}{
		{Uint8, 1, 1}, {Int8, 2, 1}, {Int32, 3, 4}, {Int64, 4, 8}, {Float16, 5, 2},
		{BFloat16, 6, 2}, {Float32, 7, 4}, {Float64, 8, 8}, {Int16, 9, 2},
	} {
		if int(tc.d) != tc.code || tc.d.Size() != tc.size {
			t.Errorf("%v: code %d size %d; want code %d size %d", tc.d, int(tc.d), tc.d.Size(), tc.code, tc.size)
		}
	}
	seen := map[DType]bool{}
	for _, d := range All {
		seen[d] = true
	}
	for d := DType(1); d.Valid(); d++ {
		if !seen[d] {
			t.Errorf("%v is valid but missing from All", d)
		}
	}
	if len(seen) != len(All) {
		t.Errorf("All = %v has duplicates", All)
	}
}

func TestParseAliases(t *testing.T) {
	for s, want := range map[string]DType{
		"u8": Uint8, "byte": Uint8, "i8": Int8, "int16": Int16, "i16": Int16, "short": Int16, " INT16 ": Int16,
		"int": Int32, "long": Int64, "half": Float16, "bf16": BFloat16, "float": Float32, "double": Float64,
	} {
		if got, err := Parse(s); err != nil || got != want {
			t.Errorf("Parse(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
}

func TestIsFloat(t *testing.T) {
	for _, d := range All {
		want := d == Float16 || d == BFloat16 || d == Float32 || d == Float64
		if d.IsFloat() != want {
			t.Errorf("%v.IsFloat() = %v", d, d.IsFloat())
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
		{Int16, []int64{3, 5}, 30},
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
