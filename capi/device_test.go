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

// What a device op's arguments mean is kolo's to check (capi converts them only): a device
// ordinal that names no device and a kind without a tensor are refused by kolo as arguments
// (errorArgument), through kolo_enqueue_device and kolo_enqueue_group alike; a shape the host path
// would refuse is, where the device path is not in use, an op to stage first (errorUnavailable),
// so that its host submission refuses it under the same name on every rank.
func TestDeviceArgumentsAreKolos(t *testing.T) {
	lockThread(t)
	initWorld(t)
	before := kolo_handles()
	x := []float32{1, 2}
	p := unsafe.Pointer(&x[0])
	// failed is the error kind and text of handle h, which must have failed at once; it releases it.
	failed := func(what string, h int64) (_Ctype_int, string) {
		t.Helper()
		if h >= 0 {
			t.Fatalf("%s: handle %d, want a failed one", what, h)
		}
		defer kolo_release(_Ctype_int64_t(-h))
		return kolo_error_kind(_Ctype_int64_t(-h)), lookup(-h).failure().Error()
	}
	for _, tc := range []struct {
		name  string
		op    testOp
		shape []int64
		kind  _Ctype_int
		want  string
	}{
		{"negative device", testOp{kind: kindAllreduce, device: -1}, []int64{2}, errorArgument, "device -1 is not a device ordinal"},
		{"barrier", testOp{kind: kindBarrier}, nil, errorArgument, "barrier has no tensor in device memory"},
		{"negative dimension", testOp{kind: kindAllreduce}, []int64{-2}, errorUnavailable, "device collectives unavailable"},
	} {
		op := tc.op
		op.in, op.out, op.dt, op.reduceOp, op.prescale, op.postscale = p, p, 7, 1, 1, 1
		b := opBlock(op, tc.shape, nil, "dev."+tc.name)
		kind, msg := failed(tc.name, int64(kolo_enqueue_device(unsafe.Pointer(&b[0]), _Ctype_int(len(b)), 0)))
		if kind != tc.kind || !strings.Contains(msg, tc.want) {
			t.Errorf("%s: error kind %d (%s), want %d saying %q", tc.name, kind, msg, tc.kind, tc.want)
		}
	}
	ins := []unsafe.Pointer{p, p}
	dts := []_Ctype_int{7, 7}
	shapes := []_Ctype_int64_t{2, 2}
	ndims := []_Ctype_int{1, 1}
	hs := make([]_Ctype_int64_t, 2)
	if rc := kolo_enqueue_group(kindAllreduce, nil, 0, 2, &ins[0], &ins[0], &dts[0], &shapes[0], &ndims[0], 1, 1, 1, 0, -1, 0, &hs[0]); rc != -1 {
		t.Errorf("device group on device -1: %d, want -1 (failed at once)", rc)
	}
	for i, h := range hs {
		if kind, msg := failed("device group member", int64(h)); kind != errorArgument || !strings.Contains(msg, "device -1 is not a device ordinal") {
			t.Errorf("device group on device -1, member %d: error kind %d (%s), want errorArgument", i, kind, msg)
		}
	}
	if kolo_handles() != before {
		t.Errorf("%d handles, want %d", kolo_handles(), before)
	}
}
