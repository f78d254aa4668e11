package main

/*
#include <stdint.h>
*/
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/kolo-dl/kolo"
)

// kolo_start_timeline starts writing a Chrome trace to the pathLen bytes at path
// (kolo.StartTimeline: rank 0 writes it unless the path contains {rank}); markCycles non-zero adds
// cycle markers. 0, or -1 with the reason in kolo_last_error.
//
//export kolo_start_timeline
func kolo_start_timeline(path *C.char, pathLen C.int, markCycles C.int) C.int {
	p, err := cString("path", "pathLen", unsafe.Pointer(path), int(pathLen))
	if err != nil {
		return setLastErr(fmt.Errorf("kolo_start_timeline: %w", err))
	}
	return setLastErr(kolo.StartTimeline(p, markCycles != 0))
}

// kolo_stop_timeline finishes the timeline's file. 0, or -1 with the reason in kolo_last_error.
//
//export kolo_stop_timeline
func kolo_stop_timeline() C.int {
	return setLastErr(kolo.StopTimeline())
}
