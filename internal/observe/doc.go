// Package observe holds what lets a user see a job while it runs, one job per sub-package, ordered
// from the rank's hot path out to the launcher's screen:
//
//   - flight: each rank's ring of its last ops (the flight recorder), written by the engine.
//   - straggle: rank 0's verdict on who arrives last, fed the coordinator's arrival times.
//   - report: the compact per-rank record that travels to the launcher, its codec, and the
//     per-host aggregation that keeps the launcher's view bounded at 1,000 ranks.
//   - view: the launcher's state folded from reports, and its renderings (status lines, the end
//     table, the stall text and the flight-recorder file).
//   - relay: moves reports and flight recorders through the rendezvous store, one round per call.
//   - metrics: a Prometheus collector over the view.
//   - console: the terminal driver that keeps the status lines under the ranks' output.
//
// The split follows the data: the packages a rank links (flight, straggle, report, relay's
// Publisher) import no terminal or HTTP code, and only the launcher's side (view, metrics,
// console) does; relay imports view for Collect, a cost a rank pays only in binary size. This package
// itself holds no code: it must not become a place where the sub-packages' shared helpers gather.
package observe
