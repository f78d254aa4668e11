// Package autotune is kolo's autotuner: a state machine that, fed the end time of every optimizer
// step on rank 0, decides which fusion threshold and negotiation cycle time the job should run with,
// and when every rank should switch. Package bayes suggests what to try, package decide judges it,
// package csvlog records it; this package runs the experiment.
//
// It is built so that tuning cannot make a job slower by luck, and wastes as few of the user's
// steps as it can:
//
//   - Defaults first. The job's own settings are the first point measured and the reference every
//     candidate is compared with: a candidate is chosen only if package decide finds it faster
//     than the defaults, so a job that is already well set, or too noisy to tell, keeps what its
//     user gave it, and the final line's speed-up and interval are against the defaults.
//   - 95% for the run, not per candidate. Each candidate is judged at confidence 1-0.05/k, k the
//     most candidates the sample budget can bring to a verdict (3 at MaxSamples 20; a verdict
//     needs 3 pairs of 2 samples after the first defaults sample), so the intervals of all the
//     run's candidates hold together with 95% confidence (Bonferroni) and the chance of crowning
//     any candidate that is not faster stays under 5% (decide's intervals are two-sided, so under
//     2.5%). A candidate dropped early (below) is never crowned and does not count.
//   - A/B interleaving. After warm-up the tuner alternates the defaults (A) and the current
//     candidate (B), A,B,A,B,...,A, and compares each B with the A on either side. Anything that
//     changes the machine's speed slowly (other jobs, thermal throttling, a data loader warming
//     up) moves both sides of every ratio and cancels, where comparing a candidate measured now
//     with defaults measured minutes ago would credit the drift to the settings.
//   - Search on, choose the fastest. A candidate shown Better does not end the tuning: it becomes
//     the incumbent if its estimated speed-up is the highest of those shown Better, and the
//     search goes on while the budget lasts; the decision is the incumbent. A tuner that stopped at
//     the first Better candidate could crown a 1.06x corner and never see a 1.4x point. The defaults
//     stay A throughout, rather than the incumbent: every candidate's interval is then a direct
//     comparison with the defaults, which is what the guarantee and the final line are about,
//     with no chained intervals (incumbent over defaults times candidate over incumbent) whose
//     width adds up and whose error rates compound; choosing the highest estimate among
//     candidates whose intervals all hold is still "faster than the defaults" at 95%. The cost
//     is that half the samples run the defaults, which the A/B design pays anyway.
//   - Dropping early. A candidate whose pairs so far put it, at 99% one-sided, below the
//     incumbent's estimate (or below decide's 1% no-gain speed-up when there is none) is dropped
//     before decide's verdict, which needs 3 pairs: the noise is estimated from all pairs and
//     successive defaults samples measured so far, so a candidate 10% slower costs a pair.
//   - Abandoning sooner. A candidate whose first 2 steps, and every step since, each took 1.25
//     times the defaults' step time or longer ends its sample there and is dropped after the
//     defaults sample that closes its pair: on a 10 ms step a 25 ms cycle time would otherwise run
//     3.5 times as long for a whole sample. An equal candidate is abandoned by chance only when each
//     of two steps runs 25% slow, and then it is only missed, never crowned.
//   - What to try. First the middle of the fusion range (log bytes) at the shorter cycle time,
//     where a fusion threshold's optimum usually is and no corner looks; then the corner of the box
//     farthest from the defaults, where a model that has seen one point expects the most; then the
//     defaults with the corner's cycle time, which separates the knobs' effects. After that the
//     Gaussian process (package bayes) suggests by expected improvement, never within a short
//     distance of a point measured (A/B could not tell them apart in the budget). Every finished
//     candidate's mean log time ratio to the defaults goes to the model. The box's cycle times end
//     at half the defaults' step time as warm-up measured it (at most 25 ms): a cycle delays every
//     step's negotiation, so on a fast-step job a long one can only cost.
//   - Samples sized by time. Unless StepsPerSample fixes a count (Horovod's
//     --autotune-steps-per-sample), a sample lasts at least 1 s and 5 steps, and at most the steps
//     that still decide within 300 (10 at the defaults): a 400 ms step's sample is 5 steps, so a
//     slow job decides in fewer steps, and a 10 ms step's is 10, the most the 300-step budget allows
//     with 20 samples. The switch steps (below) are the same whatever the sample's length.
//   - Stopping. The tuner decides when the samples left cannot give a candidate its 3 pairs, or
//     when the model expects less than 1% from the best point it can suggest. At MaxSamples 20, 10
//     steps a sample, 3 warm-up samples and Lag 2 the last possible decision is before step 300.
//   - Clean samples. A sample is consecutive steps under one setting, timed from the end of the
//     step before its first to the end of its last. Every switch is decided at a sample's end, at
//     step s, and applies from step s+Lag on every rank (the broadcast needs the time); the steps
//     s+1..s+Lag-1 still run the old settings and belong to no sample, and neither does step s+Lag,
//     the first under the new ones: a negotiation cycle that began in the old regime sleeps out the
//     old cycle time into it, and a new fusion threshold is sized there. The next sample is timed
//     from the end of step s+Lag. A switch thus costs Lag steps.
//   - The world. Every log row says the world it was measured in (its elastic round, ranks and
//     hosts), and a decision is read back only for a world of the same ranks and hosts
//     (DecisionFor): an elastic job's rounds append to one log, each tuning for its own world.
//
// The package is pure: no goroutines, no clock (the caller passes the time), no engine imports, no
// files (the caller opens the log and hands over an io.Writer). The engine calls Tuner.Step on rank
// 0 after every optimizer step and broadcasts what it returns; a Tuner is not safe for concurrent
// use.
package autotune
