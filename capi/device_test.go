package main

import (
	"strings"
	"testing"
	"unsafe"
)

// Without NCCL (none on a CI machine), setting the device path up succeeds and decides to stage,
// saying why, and a device op fails at once as one to stage (errorUnavailable), so that the
// binding runs it through host memory as before.
func TestDevicePathWithoutNCCLStages(t *testing.T) {
	lockThread(t)
	initWorld(t)
	before := kolo_handles()
	h := kolo_device_setup(0, nil, 0)
	waitFor(t, func() bool { return kolo_wait(h, 10000, 0) != statusPending })
	if st := kolo_poll(h); st != statusOK {
		t.Fatalf("setup: status %d, error %v", st, lookup(int64(h)).failure())
	}
	kolo_release(h)
	if use := kolo_device_decision(); use != 0 {
		t.Fatalf("decision %d, want 0 (staged)", use)
	}
	n := kolo_device_why(nil, 0)
	buf := make([]byte, n+1)
	kolo_device_why((*_Ctype_char)(unsafe.Pointer(&buf[0])), _Ctype_int(len(buf)))
	why := string(buf[:n])
	if !strings.Contains(strings.ToLower(why), "nccl") {
		t.Errorf("why = %q, want the library named", why)
	}
	x := []float32{1, 2}
	op := testOp{in: unsafe.Pointer(&x[0]), out: unsafe.Pointer(&x[0]), kind: kindAllreduce, dt: 7, reduceOp: 1, prescale: 1, postscale: 1}
	b := opBlock(op, []int64{2}, nil, "dev")
	d := int64(kolo_enqueue_device(unsafe.Pointer(&b[0]), _Ctype_int(len(b)), 0))
	if d >= 0 {
		t.Fatalf("device op handle %d, want a failed one", d)
	}
	if k := kolo_error_kind(_Ctype_int64_t(-d)); k != errorUnavailable {
		t.Errorf("error kind %d (%v), want errorUnavailable", k, lookup(-d).failure())
	}
	kolo_release(_Ctype_int64_t(-d))

	// A grouped call on device memory (kolo_enqueue_group with a stream) fails whole, every
	// handle errorUnavailable, for the binding to stage the group.
	ins := []unsafe.Pointer{unsafe.Pointer(&x[0]), unsafe.Pointer(&x[0])}
	dts := []_Ctype_int{7, 7}
	shapes := []_Ctype_int64_t{2, 2}
	ndims := []_Ctype_int{1, 1}
	hs := make([]_Ctype_int64_t, 2)
	name := []byte("devgroup")
	rc := kolo_enqueue_group(kindAllreduce, (*_Ctype_char)(unsafe.Pointer(&name[0])), _Ctype_int(len(name)), 2, &ins[0], &ins[0],
		&dts[0], &shapes[0], &ndims[0], 1, 1, 1, 0, 0, 0, &hs[0])
	if rc != -1 {
		t.Errorf("device group: %d, want -1 (failed at once)", rc)
	}
	for i, h := range hs {
		if h >= 0 {
			t.Errorf("device group member %d: handle %d, want a failed one", i, h)
			continue
		}
		if k := kolo_error_kind(-h); k != errorUnavailable {
			t.Errorf("device group member %d: error kind %d (%v), want errorUnavailable", i, k, lookup(int64(-h)).failure())
		}
		kolo_release(-h)
	}
	if kolo_handles() != before {
		t.Errorf("%d handles, want %d", kolo_handles(), before)
	}
}
