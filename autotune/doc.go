// Package autotune is kolo's autotuner: a state machine that, fed the end time of every optimizer
// step on rank 0, decides which fusion threshold and negotiation cycle time the job should run with,
// and when every rank should switch. Package bayes suggests what to try, package decide judges it,
// package csvlog records it; this package runs the experiment.
//
// It is built so that tuning cannot make a job slower by luck, and wastes as few of the user's
// steps as it can:
//
//   - Defaults first. The job's own settings are the first point measured and the one to beat: a
//     candidate is chosen only if package decide finds it faster with 95% confidence, so a job
//     that is already well set, or too noisy to tell, keeps what its user gave it.
//   - A/B interleaving. After warm-up the tuner alternates the defaults (A) and the current
//     candidate (B), A,B,A,B,...,A, and compares each B with the A on either side. Anything that
//     changes the machine's speed slowly (other jobs, thermal throttling, a data loader warming
//     up) moves both sides of every ratio and cancels, where comparing a candidate measured now
//     with defaults measured minutes ago would credit the drift to the settings.
//   - Stopping on evidence. Each look at a candidate can end it: Better (chosen at once, tuning
//     ends), NotBetter (dropped), or a per-candidate cap of pairs (dropped). A dropped candidate's
//     mean log time ratio goes to the Gaussian process, which suggests the next one by expected
//     improvement (never within a short distance of a point measured already, which A/B could not
//     tell apart in the budget), until Config.MaxSamples measured samples are spent and the
//     defaults are kept. Stopping at the first candidate shown faster trades the best point for
//     a sure gain early: the tuner promises "not slower", not "optimal".
//     The first candidate is the corner of the box farthest from the defaults, where a model that
//     has seen one point expects the most, and which tells it most about the slopes.
//   - Clean samples. A sample is StepsPerSample consecutive steps under one setting, timed from the
//     end of the step before its first to the end of its last. Every switch is decided at a sample's
//     end, at step s, and applies from step s+Lag on every rank (the broadcast needs the time); the
//     steps s+1..s+Lag-1 still run the old settings and belong to no sample, and neither does step
//     s+Lag, the first under the new ones: a negotiation cycle that began in the old regime sleeps
//     out the old cycle time into it, and a new fusion threshold is sized there. The next sample is
//     timed from the end of step s+Lag. A switch thus costs Lag steps.
//
// The package is pure: no goroutines, no clock (the caller passes the time), no engine imports, no
// files (the caller opens the log and hands over an io.Writer). The engine calls Tuner.Step on rank
// 0 after every optimizer step and broadcasts what it returns; a Tuner is not safe for concurrent
// use.
package autotune
