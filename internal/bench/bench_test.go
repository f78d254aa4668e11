package bench

import (
	"math"
	"strings"
	"testing"
)

func TestParseSizes(t *testing.T) {
	got, err := ParseSizes("4,4KiB, 256KiB,4MiB,64MiB")
	want := []int64{4, 4 << 10, 256 << 10, 4 << 20, 64 << 20}
	if err != nil || len(got) != len(want) {
		t.Fatalf("ParseSizes = %v, %v", got, err)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("size %d = %d, want %d", i, got[i], want[i])
		}
	}
	for _, bad := range []string{"", ",", "4KiB,lots"} {
		if _, err := ParseSizes(bad); err == nil {
			t.Errorf("ParseSizes(%q) accepted", bad)
		}
	}
}

func TestBusFactor(t *testing.T) {
	tests := []struct {
		op   string
		n    int
		want float64
	}{
		{"allreduce", 2, 1}, {"allreduce", 4, 1.5}, {"allgather", 4, 0.75},
		{"reducescatter", 8, 0.875}, {"alltoall", 2, 0.5}, {"broadcast", 8, 1}, {"allreduce", 1, 1},
	}
	for _, tc := range tests {
		if got := busFactor(tc.op, tc.n); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("busFactor(%s, %d) = %v, want %v", tc.op, tc.n, got, tc.want)
		}
	}
}

func TestHumanBytes(t *testing.T) {
	for n, want := range map[int64]string{4: "4B", 4096: "4KiB", 64 << 20: "64MiB", 1 << 30: "1GiB", 5000: "5000B"} {
		if got := HumanBytes(n); got != want {
			t.Errorf("HumanBytes(%d) = %q, want %q", n, got, want)
		}
	}
	if !strings.HasSuffix(HumanBytes(3<<20), "MiB") {
		t.Error("3 MiB not in MiB")
	}
}
