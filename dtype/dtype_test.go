package dtype

import "testing"

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
