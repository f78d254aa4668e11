package kolo

// StartTimeline starts writing a Chrome trace (load it in chrome://tracing or Perfetto) of what the
// engine does to each tensor: negotiation (with each rank's submission), queueing, copies into and
// out of the fusion buffer, the collective. markCycles adds a marker for each engine cycle (each
// step of the loop that did something). Rank 0 writes the file, as Horovod's timeline does; on
// other ranks this does nothing, unless path contains "{rank}", which every rank replaces with its
// rank to write its own. A running timeline is finished first.
//
// The environment starts one at Init: KOLO_TIMELINE=path (or HOROVOD_TIMELINE) and
// KOLO_TIMELINE_MARK_CYCLES=1 (or HOROVOD_TIMELINE_MARK_CYCLES), which kolo run sets from
// --timeline-filename and --timeline-mark-cycles. The file is a complete JSON array after every
// write (about every 100 ms), also when the process is killed.
func StartTimeline(path string, markCycles bool) error {
	s, err := get()
	if err != nil {
		return err
	}
	return s.engine.StartTimeline(path, markCycles)
}

// StopTimeline finishes the timeline's file, if one is being written. Shutdown does too.
func StopTimeline() error {
	s, err := get()
	if err != nil {
		return err
	}
	return s.engine.StopTimeline()
}
