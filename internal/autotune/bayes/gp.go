package bayes

import (
	"errors"
	"fmt"
	"math"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/blas64"
	"gonum.org/v1/gonum/mat"
)

// matern52 is the Gaussian process's covariance between two points at scaled distance² r2 (each
// dimension's difference divided by its length scale): the Matérn 5/2 kernel,
// (1 + √5r + 5r²/3)·exp(-√5r), twice differentiable, not infinitely, so it does not pretend a
// step-time surface is as smooth as a sine. The usual choice for tuning.
func matern52(r2 float64) float64 {
	r := math.Sqrt(5 * r2)
	return (1 + r + r*r/3) * math.Exp(-r)
}

// lengthGrid is where the fit looks for each length scale, in normalised units (the box is 1 wide).
// Below 0.03 the model would explain every sample on its own; above 10 a dimension is as good as
// ignored, which is what the largest value says.
var lengthGrid = []float64{0.03, 0.05, 0.08, 0.12, 0.18, 0.27, 0.4, 0.6, 0.9, 1.4, 2.2, 3.5, 10}

// maxCond is the largest condition number accepted from a Cholesky factorisation before more jitter
// is added: beyond it, solves lose more than a few of float64's 16 digits.
const maxCond = 1e12

var errFactor = errors.New("kernel matrix not positive definite even with jitter")

// model is a GP posterior on standardised outputs over unit coordinates.
type model struct {
	dims   []Dim
	noise  float64
	x      [][]float64 // unit coordinates
	y      []float64   // standardised
	mean   float64     // of the raw outputs
	scale  float64     // std of the raw outputs, 1 if they do not vary
	ls     []float64   // length scale per dimension
	chol   mat.Cholesky
	lower  mat.TriDense  // Cholesky factor L, K = L·Lᵀ
	alpha  *mat.VecDense // K⁻¹y
	jitter float64       // added to K's diagonal beyond noise
}

func dist2(a, b []float64, ls []float64) float64 {
	var s float64
	for d := range a {
		diff := (a[d] - b[d]) / ls[d]
		s += diff * diff
	}
	return s
}

// factor builds K with the given length scales and factorises it, adding jitter on failure: two
// samples at the same point (or nearly) make K singular, which is data, not a bug.
func (m *model) factor(ls []float64, chol *mat.Cholesky) (jitter float64, err error) {
	n := len(m.x)
	k := mat.NewSymDense(n, nil)
	for i := range n {
		for j := i; j < n; j++ {
			k.SetSym(i, j, matern52(dist2(m.x[i], m.x[j], ls)))
		}
	}
	for jitter = 1e-10; jitter <= 1e-1; jitter *= 100 {
		for i := range n {
			k.SetSym(i, i, 1+m.noise+jitter)
		}
		if chol.Factorize(k) && chol.Cond() <= maxCond {
			return jitter, nil
		}
	}
	return 0, errFactor
}

// logLikelihood is the log marginal likelihood of the data under length scales ls, up to the constant
// -n/2·log(2π); -Inf if K cannot be factorised.
func (m *model) logLikelihood(ls []float64) float64 {
	var chol mat.Cholesky
	if _, err := m.factor(ls, &chol); err != nil {
		return math.Inf(-1)
	}
	y := mat.NewVecDense(len(m.y), m.y)
	var a mat.VecDense
	if err := chol.SolveVecTo(&a, y); err != nil {
		var c mat.Condition
		if !errors.As(err, &c) {
			return math.Inf(-1)
		}
	}
	return -0.5*mat.Dot(y, &a) - 0.5*chol.LogDet()
}

// fit standardises y, chooses length scales and factorises K. The length scales are a coordinate
// search over lengthGrid, starting from the best single scale shared by all dimensions: D×grid
// factorisations instead of grid^D, deterministic, and with no gradients to get wrong.
func (m *model) fit(raw []float64) error {
	n := len(raw)
	m.mean = 0
	for _, v := range raw {
		m.mean += v
	}
	m.mean /= float64(n)
	var ss float64
	for _, v := range raw {
		ss += (v - m.mean) * (v - m.mean)
	}
	m.scale = 1
	if n > 1 {
		if s := math.Sqrt(ss / float64(n-1)); s > 0 {
			m.scale = s
		}
	}
	m.y = make([]float64, n)
	for i, v := range raw {
		m.y[i] = (v - m.mean) / m.scale
	}

	ls := make([]float64, len(m.dims))
	best := math.Inf(-1)
	var bestL float64 = 1
	for _, l := range lengthGrid {
		for d := range ls {
			ls[d] = l
		}
		if v := m.logLikelihood(ls); v > best {
			best, bestL = v, l
		}
	}
	for d := range ls {
		ls[d] = bestL
	}
	if len(m.dims) > 1 {
		for sweep := 0; sweep < 2; sweep++ {
			changed := false
			for d := range ls {
				keep := ls[d]
				for _, l := range lengthGrid {
					ls[d] = l
					if v := m.logLikelihood(ls); v > best {
						best, keep, changed = v, l, true
					}
				}
				ls[d] = keep
			}
			if !changed {
				break
			}
		}
	}
	m.ls = ls

	jitter, err := m.factor(ls, &m.chol)
	if err != nil {
		return fmt.Errorf("bayes: fit %d points: %w", n, err)
	}
	m.jitter = jitter
	m.chol.LTo(&m.lower)
	m.alpha = mat.NewVecDense(n, nil)
	if err := m.chol.SolveVecTo(m.alpha, mat.NewVecDense(n, m.y)); err != nil {
		var c mat.Condition
		if !errors.As(err, &c) {
			return fmt.Errorf("bayes: fit %d points: %w", n, err)
		}
	}
	return nil
}

// predict is the posterior mean and variance of the latent function at unit point u, standardised.
func (m *model) predict(u []float64) (mean, variance float64) {
	n := len(m.x)
	ks := mat.NewVecDense(n, nil)
	for i, xi := range m.x {
		ks.SetVec(i, matern52(dist2(u, xi, m.ls)))
	}
	mean = mat.Dot(ks, m.alpha)
	// Var = k(u,u) - k*ᵀK⁻¹k* = 1 - |L⁻¹k*|²: the triangular solve keeps it from going negative
	// through cancellation as k*ᵀK⁻¹k* would. blas64.Trsv, not VecDense.SolveVec, because the latter
	// estimates L's condition number on every call (half of Suggest's time), and fit has already
	// made sure it is good.
	v := ks.RawVector()
	blas64.Trsv(blas.NoTrans, m.lower.RawTriangular(), v)
	variance = math.Max(0, 1-blas64.Dot(v, v))
	return mean, variance
}
