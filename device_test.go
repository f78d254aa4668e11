package kolo

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/dtype"
)

// Without NCCL (none on a CI machine) the device path decides to stage, saying why, and a device
// op fails at once as one to stage.
func TestDevicePathStagesWithoutNCCL(t *testing.T) {
	initSingle(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dec, err := DevicePath(ctx, 0)
	if err != nil || dec.Use || !errors.Is(dec.Why, ErrDeviceUnavailable) || !strings.Contains(strings.ToLower(dec.Why.Error()), "nccl") {
		t.Fatalf("DevicePath: %+v, %v; want staged, the library named", dec, err)
	}
	h := SubmitDevice(KindAllreduce, "x", DeviceTensor{Ptr: 1 << 20, DType: dtype.Float32, Shape: []int64{2}}, 1<<20, Sum, 0, nil, 0, 0)
	if err := h.Wait(ctx); !errors.Is(err, ErrDeviceUnavailable) {
		t.Errorf("device op: %v, want ErrDeviceUnavailable", err)
	}
}

// A KOLO_NCCL the library cannot read fails Init, naming it.
func TestInitRefusesABadKOLONCCL(t *testing.T) {
	t.Setenv("KOLO_NCCL", "maybe")
	err := Init()
	if err == nil {
		_ = Shutdown()
	}
	if err == nil || !strings.Contains(err.Error(), "KOLO_NCCL=maybe") {
		t.Errorf("Init with KOLO_NCCL=maybe: %v", err)
	}
}
