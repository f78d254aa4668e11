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

// Process sets. Adding and removing one is collective and may wait on other ranks, so both return a
// handle like an op: the caller waits on it in short slices (kolo_wait), reads the error
// (kolo_error) or the new set's id (kolo_process_set_id), then releases it.

// kolo_add_process_set registers the n job ranks at ranks as a process set (every rank calls it
// with the same ranks) and returns a handle, negative when it failed at once (a refused argument
// included).
//
//export kolo_add_process_set
func kolo_add_process_set(ranks *C.int, n C.int) C.int64_t {
	rs, err := processSetRanks(unsafe.Pointer(ranks), int(n))
	if err != nil {
		return issued(&op{err: fmt.Errorf("kolo_add_process_set: %w", err)})
	}
	return issued(&op{h: kolo.AddProcessSetAsync(rs)})
}

// processSetRanks reads the n C ints at p as job ranks.
func processSetRanks(p unsafe.Pointer, n int) ([]int, error) {
	in, err := cArray[int32]("ranks", "n", p, n)
	if err != nil {
		return nil, err
	}
	rs := make([]int, len(in))
	for i, r := range in {
		if r < 0 {
			return nil, &argError{"ranks", i, r, "negative rank"}
		}
		rs[i] = int(r)
	}
	return rs, nil
}

// kolo_remove_process_set removes process set id (collectively) and returns a handle.
//
//export kolo_remove_process_set
func kolo_remove_process_set(id C.int) C.int64_t {
	if err := notNegative("id", id); err != nil {
		return issued(&op{err: fmt.Errorf("kolo_remove_process_set: %w", err)})
	}
	return issued(&op{h: kolo.RemoveProcessSetAsync(int(id))})
}

// kolo_process_set_id is, for a completed kolo_add_process_set, the new set's id; -1 otherwise.
//
//export kolo_process_set_id
func kolo_process_set_id(h C.int64_t) C.int {
	kh, err := completed(h)
	if err != nil {
		return setLastErr(fmt.Errorf("kolo_process_set_id: %w", err))
	}
	return C.int(kh.ProcessSetID())
}

// kolo_process_set_ranks writes up to n job ranks of process set id into dst (which may be NULL
// with n 0) and returns how many it has; -1 when there is no such set (or before init), or for a
// bad argument, with why in kolo_last_error.
//
//export kolo_process_set_ranks
func kolo_process_set_ranks(id C.int, dst *C.int, n C.int) C.int {
	out, err := cArray[int32]("dst", "n", unsafe.Pointer(dst), int(n))
	if err != nil {
		return setLastErr(fmt.Errorf("kolo_process_set_ranks: %w", err))
	}
	ps, err := kolo.ProcessSetByID(int(id))
	if err != nil {
		return setLastErr(fmt.Errorf("kolo_process_set_ranks: %w", err))
	}
	ranks := ps.Ranks()
	for i := 0; i < len(ranks) && i < len(out); i++ {
		out[i] = int32(ranks[i])
	}
	return C.int(len(ranks))
}
