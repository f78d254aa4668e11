// Package bayes is the search half of kolo's autotuner: a Gaussian-process Bayesian optimiser that,
// given step times measured at some settings, suggests the settings to measure next by expected
// improvement. It minimises, because its objective is seconds per step.
//
// Each measurement of a distributed job costs tens of seconds of the user's training, so the optimiser
// spends computation to save measurements: every Suggest refits the model's length scales to all the
// data (by maximising the log marginal likelihood over a fixed grid, so the fit is deterministic and
// needs no gradient) and scores hundreds of random candidates before refining the best few. Inputs are
// normalised to [0,1] and outputs standardised, so the length-scale grid and the noise parameter mean
// the same thing for every knob and every model; categorical knobs (on/off switches) contribute only
// "same or different" to the distance, since their levels have no order. The linear algebra is gonum's.
//
// The package is pure: it never measures anything, reads a clock or touches the engine. The caller
// measures (defaults first, through Add), asks Suggest for the next point, and picks the winner by
// posterior mean (Best), which a lucky single measurement cannot win on its own. Deciding whether the
// winner really beats the defaults is package decide's job, not this one's. An Optimizer is not safe
// for concurrent use.
package bayes
