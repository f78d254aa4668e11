package decide

import (
	"fmt"
	"slices"
)

// The smallest speed-up the rule can crown, by the noise of a pair and the pairs measured: the
// upper end of the interval of a candidate measured equal to the defaults, which a candidate's
// estimate must exceed for the interval's lower end to clear 1. The rule is the tuner's for its
// default budget (20 samples: 95% shared over 3 candidates, looks from 3 pairs to n) with a pooled
// spread of 15 degrees of freedom, as a run that has measured a few candidates has; a candidate
// judged by its own few pairs needs more. docs/benchmarks.md ("What a 95% rule can resolve
// within 300 steps") quotes this table.
func ExampleRule_Compare_resolution() {
	fmt.Println("per-pair spread | 3 pairs | 5 pairs | 9 pairs")
	for _, s := range []float64{0.01, 0.02, 0.03, 0.054} {
		fmt.Printf("%.1f%%", 100*s)
		for _, n := range []int{3, 5, 9} {
			r := Rule{Confidence: 1 - 0.05/3, MaxPairs: n, Pooled: Spread{Var: s * s, DF: 15}}
			res, err := r.Compare(slices.Repeat([]float64{1}, n+1), slices.Repeat([]float64{1}, n))
			if err != nil {
				panic(err)
			}
			fmt.Printf(" | %.3f", res.High)
		}
		fmt.Println()
	}
	// Output:
	// per-pair spread | 3 pairs | 5 pairs | 9 pairs
	// 1.0% | 1.018 | 1.017 | 1.014
	// 2.0% | 1.037 | 1.034 | 1.028
	// 3.0% | 1.055 | 1.051 | 1.043
	// 5.4% | 1.102 | 1.094 | 1.079
}
