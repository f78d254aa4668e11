package reduce

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"
)

// StreamCopy equals copy for every length around the streaming body's unit and alignment, at every
// misalignment of either side, and writes nothing outside dst.
func TestStreamCopy(t *testing.T) {
	eachKernel(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(7, 7))
		lengths := []int{0, 1, 31, 63, 64, 65, 127, 128, 129, 191, 255, 256, 1000, 4096 + 17, chunkBytes + 200, 3*chunkBytes + 65}
		for _, n := range lengths {
			for _, dOff := range []int{0, 1, 8, 33, 63} {
				for _, sOff := range []int{0, 5} {
					t.Run(fmt.Sprintf("n=%d/dst+%d/src+%d", n, dOff, sOff), func(t *testing.T) {
						const guard = 64
						src := make([]byte, n+sOff)[sOff:]
						for i := range src {
							src[i] = byte(rng.Uint32())
						}
						whole := make([]byte, dOff+n+guard)
						for i := range whole {
							whole[i] = 0xAB
						}
						dst := whole[dOff : dOff+n]
						StreamCopy(dst, src)
						if !bytes.Equal(dst, src) {
							t.Fatalf("dst differs from src")
						}
						for i, b := range whole {
							if (i < dOff || i >= dOff+n) && b != 0xAB {
								t.Fatalf("byte %d outside dst was overwritten", i-dOff)
							}
						}
					})
				}
			}
		}
	})
}

func TestStreamCopyLengthMismatchPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("StreamCopy of unequal lengths did not panic")
		}
	}()
	StreamCopy(make([]byte, 3), make([]byte, 4))
}

func TestStreamCopyOverlapPanics(t *testing.T) {
	buf := make([]byte, 256)
	for name, c := range map[string][2][]byte{"same": {buf[:128], buf[:128]}, "partly": {buf[64:192], buf[:128]}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: StreamCopy of overlapping slices did not panic", name)
				}
			}()
			StreamCopy(c[0], c[1])
		}()
	}
}
