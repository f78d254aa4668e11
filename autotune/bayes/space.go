package bayes

import (
	"errors"
	"fmt"
	"math"
)

// Kind says which values a dimension of the search box takes.
type Kind int

const (
	// Continuous takes any value in [Min, Max].
	Continuous Kind = iota
	// Integer takes whole numbers in [Min, Max] (sizes, counts, byte thresholds).
	Integer
	// Categorical takes one of Levels unordered choices, written 0..Levels-1; an on/off switch is a
	// Categorical with two levels (see Bool).
	Categorical
)

func (k Kind) String() string {
	switch k {
	case Continuous:
		return "continuous"
	case Integer:
		return "integer"
	case Categorical:
		return "categorical"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Dim is one knob of the search box. Points are []float64 with one value per Dim, in the knob's own
// units (bytes, milliseconds, 0/1).
type Dim struct {
	Name string
	Kind Kind
	// Min and Max bound Continuous and Integer dimensions; Categorical ones ignore them.
	Min, Max float64
	// Levels is the number of choices of a Categorical dimension.
	Levels int
	// Log makes the model see log(x + LogOffset) instead of x, so that equal ratios count as equal
	// distances: a 1 MiB to 2 MiB change of fusion threshold matters as much as 32 to 64 MiB. The
	// offset lets a range that starts at 0 (fusion off) be log-scaled; Min+LogOffset must be > 0.
	Log       bool
	LogOffset float64
}

// ErrBadSpace is wrapped by errors that reject a search box.
var ErrBadSpace = errors.New("bayes: bad search space")

// Real is a continuous dimension on [min, max].
func Real(name string, min, max float64) Dim {
	return Dim{Name: name, Kind: Continuous, Min: min, Max: max}
}

// Int is an integer dimension on [min, max].
func Int(name string, min, max int64) Dim {
	return Dim{Name: name, Kind: Integer, Min: float64(min), Max: float64(max)}
}

// Bool is an on/off dimension: 0 is off, 1 is on.
func Bool(name string) Dim {
	return Dim{Name: name, Kind: Categorical, Levels: 2}
}

// Choice is a categorical dimension with levels unordered choices, 0..levels-1.
func Choice(name string, levels int) Dim {
	return Dim{Name: name, Kind: Categorical, Levels: levels}
}

// LogScale returns d searched in log(x + offset); see Dim.Log.
func (d Dim) LogScale(offset float64) Dim {
	d.Log, d.LogOffset = true, offset
	return d
}

func (d Dim) validate() error {
	switch d.Kind {
	case Continuous, Integer:
		if math.IsNaN(d.Min) || math.IsNaN(d.Max) || math.IsInf(d.Min, 0) || math.IsInf(d.Max, 0) {
			return fmt.Errorf("%w: %q: bounds [%g, %g] not finite", ErrBadSpace, d.Name, d.Min, d.Max)
		}
		if !(d.Min < d.Max) {
			return fmt.Errorf("%w: %q: min %g not below max %g", ErrBadSpace, d.Name, d.Min, d.Max)
		}
		if d.Kind == Integer && (d.Min != math.Trunc(d.Min) || d.Max != math.Trunc(d.Max)) {
			return fmt.Errorf("%w: %q: integer bounds [%g, %g] not whole", ErrBadSpace, d.Name, d.Min, d.Max)
		}
		if d.Log && !(d.Min+d.LogOffset > 0) {
			return fmt.Errorf("%w: %q: log scale needs min+offset > 0, have %g+%g", ErrBadSpace, d.Name, d.Min, d.LogOffset)
		}
	case Categorical:
		if d.Levels < 2 {
			return fmt.Errorf("%w: %q: %d levels, need at least 2", ErrBadSpace, d.Name, d.Levels)
		}
		if d.Log {
			return fmt.Errorf("%w: %q: a categorical dimension has no scale to log", ErrBadSpace, d.Name)
		}
	default:
		return fmt.Errorf("%w: %q: unknown kind %v", ErrBadSpace, d.Name, d.Kind)
	}
	return nil
}

func (d Dim) warp(x float64) float64 {
	if d.Log {
		return math.Log(x + d.LogOffset)
	}
	return x
}

func (d Dim) unwarp(w float64) float64 {
	if d.Log {
		return math.Exp(w) - d.LogOffset
	}
	return w
}

// toUnit maps a value to the model's coordinate: [0,1] for ordered dimensions, the level itself for
// categorical ones (whose distance is only "same or different").
func (d Dim) toUnit(x float64) float64 {
	if d.Kind == Categorical {
		return x
	}
	lo, hi := d.warp(d.Min), d.warp(d.Max)
	return (d.warp(x) - lo) / (hi - lo)
}

// fromUnit is toUnit's inverse, snapped to a value the dimension can take, so every point the
// optimiser scores is one the caller could run.
func (d Dim) fromUnit(u float64) float64 {
	if d.Kind == Categorical {
		return math.Max(0, math.Min(float64(d.Levels-1), math.Round(u)))
	}
	u = math.Max(0, math.Min(1, u))
	lo, hi := d.warp(d.Min), d.warp(d.Max)
	x := d.unwarp(lo + u*(hi-lo))
	if d.Kind == Integer {
		x = math.Round(x)
	}
	return math.Max(d.Min, math.Min(d.Max, x))
}

// check says why x is not a value of d.
func (d Dim) check(x float64) error {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return fmt.Errorf("%q = %g is not finite", d.Name, x)
	}
	switch d.Kind {
	case Categorical:
		if x != math.Trunc(x) || x < 0 || x >= float64(d.Levels) {
			return fmt.Errorf("%q = %g is not a level in 0..%d", d.Name, x, d.Levels-1)
		}
		return nil
	case Integer:
		if x != math.Trunc(x) {
			return fmt.Errorf("%q = %g is not whole", d.Name, x)
		}
	}
	if x < d.Min || x > d.Max {
		return fmt.Errorf("%q = %g is outside [%g, %g]", d.Name, x, d.Min, d.Max)
	}
	return nil
}

// count is the number of values d takes, or 0 if it is continuous (or too many to list).
func (d Dim) count() int {
	switch d.Kind {
	case Categorical:
		return d.Levels
	case Integer:
		if n := d.Max - d.Min + 1; n <= 1<<20 {
			return int(n)
		}
	}
	return 0
}

// value is the i-th value of a discrete dimension.
func (d Dim) value(i int) float64 {
	if d.Kind == Categorical {
		return float64(i)
	}
	return d.Min + float64(i)
}
