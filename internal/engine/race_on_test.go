//go:build race

package engine

// raceEnabled: the race detector's instrumentation allocates, so allocation budgets do not hold.
const raceEnabled = true
