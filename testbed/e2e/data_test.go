package e2e

import (
	"fmt"
	"hash/fnv"
	"testing"
)

// valueHash must stay the FNV-1a of the formatted key it replaced: every rank recomputes the
// others' inputs from it, and the naive form is the definition.
func TestValueHashIsFNVOfTheKey(t *testing.T) {
	for _, tc := range []struct {
		name    string
		rank, i int
	}{{"", 0, 0}, {"big.float32", 7, 786434}, {"ar.int8.sum.13", 3, 12}, {"x", -1, -42}, {"bc.float16.2.11", 2, 1 << 40}} {
		h := fnv.New64a()
		fmt.Fprintf(h, "%s/%d/%d", tc.name, tc.rank, tc.i)
		if got, want := valueHash(tc.name, tc.rank, tc.i), h.Sum64(); got != want {
			t.Errorf("valueHash(%q, %d, %d) = %#x, want %#x", tc.name, tc.rank, tc.i, got, want)
		}
	}
}

func BenchmarkValue(b *testing.B) {
	for i := 0; i < b.N; i++ {
		Value("big.float32", 7, i, 0, 0)
	}
}
