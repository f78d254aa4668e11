// Package bayes is the search half of kolo's autotuner: a Gaussian-process Bayesian optimiser that,
// given step times measured at some settings, suggests the settings to measure next by expected
// improvement. It minimises, because its objective is seconds per step.
//
// Each measurement of a distributed job costs tens of seconds of the user's training, so the optimiser
// spends computation to save measurements: every Suggest refits the model's length scales to all the
// data (by maximising the log marginal likelihood over a fixed grid, so the fit is deterministic and
// needs no gradient) and scores hundreds of random candidates before refining the best few. Inputs are
// normalised to [0,1] and outputs standardised, so the length-scale grid and the noise parameter mean
// the same thing for every knob and every model; an on/off switch is an integer knob from 0 to 1. The
// linear algebra is gonum's.
//
// The package is pure: it never measures anything, reads a clock or touches the engine. The caller
// measures (defaults first, through Add) and asks Suggest for the next point. Expected improvement is
// reckoned from the best posterior mean at a point measured, which a lucky single measurement cannot
// set on its own. Deciding whether a point really beats the defaults is package decide's job, not
// this one's. An Optimizer is not safe for concurrent use.
package bayes
