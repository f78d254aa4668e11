package main

/*
#include <stdint.h>
*/
import "C"

import (
	"unsafe"

	"github.com/kolo-dl/kolo"
)

// Process sets. Adding and removing one is collective and may wait on other ranks, so both return a
// handle like an op: the caller waits on it in short slices (kolo_wait), reads the error
// (kolo_error) or the new set's id (kolo_process_set_id), then releases it.

// kolo_add_process_set registers the n job ranks at ranks as a process set (every rank calls it
// with the same ranks) and returns a handle, negative when it failed at once.
//
//export kolo_add_process_set
func kolo_add_process_set(ranks *C.int, n C.int) C.int64_t {
	var rs []int
	if ranks != nil && n > 0 {
		for _, r := range unsafe.Slice((*int32)(unsafe.Pointer(ranks)), int(n)) {
			rs = append(rs, int(r))
		}
	}
	return issued(&op{h: kolo.AddProcessSetAsync(rs)})
}

// kolo_remove_process_set removes process set id (collectively) and returns a handle.
//
//export kolo_remove_process_set
func kolo_remove_process_set(id C.int) C.int64_t {
	return issued(&op{h: kolo.RemoveProcessSetAsync(int(id))})
}

// kolo_process_set_id is, for a completed kolo_add_process_set, the new set's id; -1 otherwise.
//
//export kolo_process_set_id
func kolo_process_set_id(h C.int64_t) C.int {
	o := lookup(h)
	if o == nil || o.status() != statusOK {
		return -1
	}
	return C.int(o.h.ProcessSetID())
}

// kolo_process_set_ranks writes up to n job ranks of process set id into dst and returns how many
// it has; -1 when there is no such set (or before init).
//
//export kolo_process_set_ranks
func kolo_process_set_ranks(id C.int, dst *C.int, n C.int) C.int {
	ps, err := kolo.ProcessSetByID(int(id))
	if err != nil {
		return -1
	}
	ranks := ps.Ranks()
	if dst != nil && n > 0 {
		out := unsafe.Slice((*int32)(unsafe.Pointer(dst)), int(n))
		for i := 0; i < len(ranks) && i < len(out); i++ {
			out[i] = int32(ranks[i])
		}
	}
	return C.int(len(ranks))
}
