//go:build !cgo || !linux

package nccl

import (
	"errors"
	"testing"

	"github.com/kolo-dl/kolo/internal/gpu"
)

func TestOpenWithoutCgo(t *testing.T) {
	b, err := Open(Options{})
	if b != nil || !errors.Is(err, ErrNoCgo) || !errors.Is(err, gpu.ErrUnavailable) || err.Error() != "device collectives unavailable: built without cgo: NCCL unavailable" {
		t.Fatalf("Open = %v, %v", b, err)
	}
}
