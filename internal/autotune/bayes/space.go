package bayes

import (
	"errors"
	"fmt"
	"math"
)

// Dim is one knob of the search box. Points are []float64 with one value per Dim, in the knob's own
// units (bytes, milliseconds, 0/1).
type Dim struct {
	Name string
	// Integer says the knob takes whole numbers only (sizes, byte thresholds, 0/1 switches);
	// otherwise any value in [Min, Max].
	Integer  bool
	Min, Max float64
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
	return Dim{Name: name, Min: min, Max: max}
}

// Int is an integer dimension on [min, max].
func Int(name string, min, max int64) Dim {
	return Dim{Name: name, Integer: true, Min: float64(min), Max: float64(max)}
}

// LogScale returns d searched in log(x + offset); see Dim.Log.
func (d Dim) LogScale(offset float64) Dim {
	d.Log, d.LogOffset = true, offset
	return d
}

func (d Dim) validate() error {
	if math.IsNaN(d.Min) || math.IsNaN(d.Max) || math.IsInf(d.Min, 0) || math.IsInf(d.Max, 0) {
		return fmt.Errorf("%w: %q: bounds [%g, %g] not finite", ErrBadSpace, d.Name, d.Min, d.Max)
	}
	if !(d.Min < d.Max) {
		return fmt.Errorf("%w: %q: min %g not below max %g", ErrBadSpace, d.Name, d.Min, d.Max)
	}
	if d.Integer && (d.Min != math.Trunc(d.Min) || d.Max != math.Trunc(d.Max)) {
		return fmt.Errorf("%w: %q: integer bounds [%g, %g] not whole", ErrBadSpace, d.Name, d.Min, d.Max)
	}
	if d.Log && !(d.Min+d.LogOffset > 0) {
		return fmt.Errorf("%w: %q: log scale needs min+offset > 0, have %g+%g", ErrBadSpace, d.Name, d.Min, d.LogOffset)
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

// Unit maps a value to the model's coordinate, in which it measures distance: where x lies along
// the dimension, from 0 to 1.
func (d Dim) Unit(x float64) float64 {
	lo, hi := d.warp(d.Min), d.warp(d.Max)
	return (d.warp(x) - lo) / (hi - lo)
}

// fromUnit is Unit's inverse, snapped to a value the dimension can take, so every point the
// optimiser scores is one the caller could run.
func (d Dim) fromUnit(u float64) float64 {
	u = math.Max(0, math.Min(1, u))
	lo, hi := d.warp(d.Min), d.warp(d.Max)
	x := d.unwarp(lo + u*(hi-lo))
	if d.Integer {
		x = math.Round(x)
	}
	return math.Max(d.Min, math.Min(d.Max, x))
}

// check says why x is not a value of d.
func (d Dim) check(x float64) error {
	switch {
	case math.IsNaN(x) || math.IsInf(x, 0):
		return fmt.Errorf("%q = %g is not finite", d.Name, x)
	case d.Integer && x != math.Trunc(x):
		return fmt.Errorf("%q = %g is not whole", d.Name, x)
	case x < d.Min || x > d.Max:
		return fmt.Errorf("%q = %g is outside [%g, %g]", d.Name, x, d.Min, d.Max)
	}
	return nil
}
