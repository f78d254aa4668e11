package fake

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/gpu"
	"github.com/kolo-dl/kolo/internal/reduce"
)

// rank is one fake process: its device, its stream and its end of a communicator.
type rank struct {
	dev  *Device
	s    gpu.Stream
	comm gpu.Comm
}

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// newRanks forms a communicator of n fake ranks.
func newRanks(t *testing.T, n int) []*rank {
	t.Helper()
	lib := NewLibrary()
	id, err := lib.NewUniqueID()
	if err != nil {
		t.Fatal(err)
	}
	rs := make([]*rank, n)
	errs := parallel(n, func(r int) error {
		d := NewDevice()
		s, err := d.NewStream()
		if err != nil {
			return err
		}
		c, err := lib.NewComm(testCtx(t), d, id, n, r)
		if err != nil {
			return err
		}
		rs[r] = &rank{d, s, c}
		return nil
	})
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, r := range rs {
			_ = r.comm.Abort()
			_ = r.s.Destroy()
		}
	})
	return rs
}

func parallel(n int, f func(r int) error) []error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() { errs[r] = f(r) })
	}
	wg.Wait()
	return errs
}

// upload copies b into fresh device memory.
func upload(t *testing.T, d *Device, b []byte) gpu.Ptr {
	t.Helper()
	p, err := d.Alloc(len(b))
	if err != nil {
		t.Fatal(err)
	}
	host, err := d.Bytes(p, len(b))
	if err != nil {
		t.Fatal(err)
	}
	copy(host, b)
	return p
}

func download(t *testing.T, d *Device, p gpu.Ptr, n int) []byte {
	t.Helper()
	host, err := d.Bytes(p, n)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Clone(host)
}

// randomData is count elements of t: small values for floats (so products stay finite), any
// bits for integers (wrap-around is part of the contract).
func randomData(rng *rand.Rand, t gpu.DataType, count int) []byte {
	b := make([]byte, count*t.Size())
	for i := range count {
		f := float32(rng.IntN(9)-4) / 2
		e := b[i*t.Size():]
		switch t {
		case gpu.Float16:
			le.PutUint16(e, reduce.Float32ToFloat16Bits(f))
		case gpu.BFloat16:
			le.PutUint16(e, reduce.Float32ToBFloat16Bits(f))
		case gpu.Float32:
			le.PutUint32(e, math.Float32bits(f*1.37))
		case gpu.Float64:
			le.PutUint64(e, math.Float64bits(float64(f)*1.37))
		default:
			for j := range t.Size() {
				e[j] = byte(rng.Uint32())
			}
		}
	}
	return b
}

// ref is the naive reduction: decode every rank's element, fold in rank order in the element's
// own arithmetic (Go's typed operators), encode.
func ref(t gpu.DataType, op gpu.RedOp, ins [][]byte) []byte {
	out := make([]byte, len(ins[0]))
	sz := t.Size()
	n := len(ins)
	for off := 0; off < len(out); off += sz {
		switch t {
		case gpu.Int8:
			out[off] = byte(fold(op, n, func(r int) int8 { return int8(ins[r][off]) }))
		case gpu.Uint8:
			out[off] = fold(op, n, func(r int) uint8 { return ins[r][off] })
		case gpu.Int32:
			le.PutUint32(out[off:], uint32(fold(op, n, func(r int) int32 { return int32(le.Uint32(ins[r][off:])) })))
		case gpu.Uint32:
			le.PutUint32(out[off:], fold(op, n, func(r int) uint32 { return le.Uint32(ins[r][off:]) }))
		case gpu.Int64:
			le.PutUint64(out[off:], uint64(fold(op, n, func(r int) int64 { return int64(le.Uint64(ins[r][off:])) })))
		case gpu.Uint64:
			le.PutUint64(out[off:], fold(op, n, func(r int) uint64 { return le.Uint64(ins[r][off:]) }))
		case gpu.Float32:
			le.PutUint32(out[off:], math.Float32bits(fold(op, n, func(r int) float32 { return math.Float32frombits(le.Uint32(ins[r][off:])) })))
		case gpu.Float64:
			le.PutUint64(out[off:], math.Float64bits(fold(op, n, func(r int) float64 { return math.Float64frombits(le.Uint64(ins[r][off:])) })))
		case gpu.Float16, gpu.BFloat16:
			// Halves round after every step: fold in float32, rounding through the type.
			dec, enc := reduce.Float16BitsToFloat32, reduce.Float32ToFloat16Bits
			if t == gpu.BFloat16 {
				dec, enc = reduce.BFloat16BitsToFloat32, reduce.Float32ToBFloat16Bits
			}
			round := func(f float32) float32 { return dec(enc(f)) }
			x := func(r int) float32 { return dec(le.Uint16(ins[r][off:])) }
			var acc float32
			if op == gpu.Avg {
				for r := range n {
					acc = round(acc + round(x(r)*(1/float32(n))))
				}
			} else {
				acc = x(0)
				for r := 1; r < n; r++ {
					acc = round(apply(op, acc, x(r)))
				}
			}
			le.PutUint16(out[off:], enc(acc))
		}
	}
	return out
}

func apply[T number](op gpu.RedOp, a, b T) T {
	switch op {
	case gpu.Prod:
		return a * b
	case gpu.Max:
		return max(a, b)
	case gpu.Min:
		return min(a, b)
	}
	return a + b
}

func fold[T number](op gpu.RedOp, n int, x func(int) T) T {
	acc := x(0)
	for r := 1; r < n; r++ {
		acc = apply(op, acc, x(r))
	}
	if op == gpu.Avg {
		acc /= T(n)
	}
	return acc
}

// close enough: floats' Avg is a pre-multiplied sum on the device, the reference divides the sum.
func sameResult(t gpu.DataType, op gpu.RedOp, got, want []byte) bool {
	if op != gpu.Avg || (t != gpu.Float32 && t != gpu.Float64) {
		return bytes.Equal(got, want)
	}
	for off := 0; off < len(got); off += t.Size() {
		var g, w float64
		if t == gpu.Float32 {
			g, w = float64(math.Float32frombits(le.Uint32(got[off:]))), float64(math.Float32frombits(le.Uint32(want[off:])))
		} else {
			g, w = math.Float64frombits(le.Uint64(got[off:])), math.Float64frombits(le.Uint64(want[off:]))
		}
		if math.Abs(g-w) > 1e-5*(1+math.Abs(w)) {
			return false
		}
	}
	return true
}

var counts = []int{0, 1, 7, 13, 1001}

func TestAllReduceAndReduceScatterMatchReference(t *testing.T) {
	for _, n := range []int{1, 3, 4} {
		rs := newRanks(t, n)
		rng := rand.New(rand.NewPCG(uint64(n), 1))
		for _, dt := range gpu.DataTypes {
			for _, op := range gpu.RedOps {
				for _, count := range counts {
					for _, inPlace := range []bool{false, true} {
						name := fmt.Sprintf("n=%d/%s/%s/%d/inplace=%v", n, dt, op, count, inPlace)
						ins := make([][]byte, n)
						for r := range n {
							ins[r] = randomData(rng, dt, count*n)
						}
						want := ref(dt, op, ins)
						sz := count * n * dt.Size()
						errs := parallel(n, func(r int) error {
							send := upload(t, rs[r].dev, ins[r])
							recv := send
							if !inPlace {
								recv = upload(t, rs[r].dev, make([]byte, sz))
							}
							if err := rs[r].comm.AllReduce(send, recv, count*n, dt, op, rs[r].s); err != nil {
								return err
							}
							rsOut := upload(t, rs[r].dev, make([]byte, sz/max(n, 1)))
							if err := rs[r].comm.ReduceScatter(upload(t, rs[r].dev, ins[r]), rsOut, count, dt, op, rs[r].s); err != nil {
								return err
							}
							if err := rs[r].s.Synchronize(testCtx(t)); err != nil {
								return err
							}
							if got := download(t, rs[r].dev, recv, sz); !sameResult(dt, op, got, want) {
								return fmt.Errorf("allreduce rank %d: got %x, want %x", r, got, want)
							}
							block := count * dt.Size()
							if got := download(t, rs[r].dev, rsOut, block); !sameResult(dt, op, got, want[r*block:(r+1)*block]) {
								return fmt.Errorf("reducescatter rank %d: got %x, want %x", r, got, want[r*block:(r+1)*block])
							}
							return rs[r].comm.AsyncError()
						})
						for _, err := range errs {
							if err != nil {
								t.Fatalf("%s: %v", name, err)
							}
						}
					}
				}
			}
		}
	}
}

func TestAllGatherBroadcastAllToAllMatchReference(t *testing.T) {
	for _, n := range []int{1, 3, 4} {
		rs := newRanks(t, n)
		rng := rand.New(rand.NewPCG(uint64(n), 2))
		for _, count := range counts {
			dt := gpu.DataTypes[rng.IntN(len(gpu.DataTypes))]
			sz := dt.Size()
			ins := make([][]byte, n)
			var gathered []byte
			for r := range n {
				ins[r] = randomData(rng, dt, count)
				gathered = append(gathered, ins[r]...)
			}
			root := rng.IntN(n)
			// Uneven all-to-all: rank r sends split[r][p] elements to p.
			split := make([][]int, n)
			payload := make([][][]byte, n)
			for r := range n {
				split[r] = make([]int, n)
				payload[r] = make([][]byte, n)
				for p := range n {
					split[r][p] = rng.IntN(count + 1)
					payload[r][p] = randomData(rng, dt, split[r][p])
				}
			}
			errs := parallel(n, func(r int) error {
				d, s, c := rs[r].dev, rs[r].s, rs[r].comm
				agOut := upload(t, d, make([]byte, n*count*sz))
				if err := c.AllGather(upload(t, d, ins[r]), agOut, count, dt, s); err != nil {
					return err
				}
				bc := upload(t, d, ins[r])
				if err := c.Broadcast(bc, bc, count, dt, root, s); err != nil {
					return err
				}
				var sendBuf []byte
				var want []byte
				sendCounts, sendDispls := make([]int, n), make([]int, n)
				recvCounts, recvDispls := make([]int, n), make([]int, n)
				sent, recvd := 0, 0
				for p := range n {
					sendBuf = append(sendBuf, payload[r][p]...)
					sendCounts[p], sendDispls[p] = split[r][p], sent
					sent += split[r][p]
					want = append(want, payload[p][r]...)
					recvCounts[p], recvDispls[p] = split[p][r], recvd
					recvd += split[p][r]
				}
				a2aOut := upload(t, d, make([]byte, recvd*sz))
				if err := gpu.AllToAll(c, upload(t, d, sendBuf), sendCounts, sendDispls, a2aOut, recvCounts, recvDispls, dt, s); err != nil {
					return err
				}
				if err := s.Synchronize(testCtx(t)); err != nil {
					return err
				}
				if got := download(t, d, agOut, n*count*sz); !bytes.Equal(got, gathered) {
					return fmt.Errorf("allgather rank %d: got %x, want %x", r, got, gathered)
				}
				if got := download(t, d, bc, count*sz); !bytes.Equal(got, ins[root]) {
					return fmt.Errorf("broadcast from %d, rank %d: got %x, want %x", root, r, got, ins[root])
				}
				if got := download(t, d, a2aOut, recvd*sz); !bytes.Equal(got, want) {
					return fmt.Errorf("alltoall rank %d: got %x, want %x", r, got, want)
				}
				return c.AsyncError()
			})
			for _, err := range errs {
				if err != nil {
					t.Fatalf("n=%d count=%d %s: %v", n, count, dt, err)
				}
			}
		}
	}
}

// A lost rank leaves its peers blocked in the collective, as NCCL does: no error, no progress,
// until each one aborts; then their streams drain and the communicator reports ErrAborted.
func TestLostRankBlocksPeersUntilAbort(t *testing.T) {
	rs := newRanks(t, 3)
	rs[2].comm.(*Comm).Lose()
	bufs := make([]gpu.Ptr, 3)
	for r := range 3 {
		bufs[r] = upload(t, rs[r].dev, randomData(rand.New(rand.NewPCG(1, uint64(r))), gpu.Float32, 5))
		if err := rs[r].comm.AllReduce(bufs[r], bufs[r], 5, gpu.Float32, gpu.Sum, rs[r].s); err != nil {
			t.Fatal(err)
		}
	}
	short := func() context.Context {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		t.Cleanup(cancel)
		return ctx
	}
	for r := range 2 {
		if err := rs[r].s.Synchronize(short()); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("rank %d: synchronize with a lost peer = %v, want a deadline", r, err)
		}
		if err := rs[r].comm.AsyncError(); err != nil {
			t.Fatalf("rank %d: NCCL reports nothing about a silent peer, fake reported %v", r, err)
		}
	}
	// Rank 0 aborts: it is free, rank 1 is still blocked.
	if err := rs[0].comm.Abort(); err != nil {
		t.Fatal(err)
	}
	if err := rs[0].s.Synchronize(testCtx(t)); err != nil {
		t.Fatalf("rank 0 after abort: %v", err)
	}
	if err := rs[1].s.Synchronize(short()); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("rank 1 before its own abort: %v, want still blocked", err)
	}
	if err := rs[1].comm.Abort(); err != nil {
		t.Fatal(err)
	}
	if err := rs[1].s.Synchronize(testCtx(t)); err != nil {
		t.Fatalf("rank 1 after abort: %v", err)
	}
	for r := range 2 {
		if err := rs[r].comm.AsyncError(); !errors.Is(err, gpu.ErrAborted) {
			t.Fatalf("rank %d AsyncError after abort = %v", r, err)
		}
		if err := rs[r].comm.AllReduce(bufs[r], bufs[r], 5, gpu.Float32, gpu.Sum, rs[r].s); !errors.Is(err, gpu.ErrAborted) {
			t.Fatalf("rank %d enqueue after abort = %v", r, err)
		}
	}
	// The lost rank's own stream is freed by its abort too (its process would be gone).
	_ = rs[2].comm.Abort()
	if err := rs[2].s.Synchronize(testCtx(t)); err != nil {
		t.Fatal(err)
	}
}

// The engine's ordering: its stream waits on an event recorded after the producer's work, and the
// consumer waits on the completion event, with no host synchronisation in between.
func TestEventsOrderStreams(t *testing.T) {
	rs := newRanks(t, 2)
	d := rs[1].dev
	producer, consumer := rs[1].s, mustStream(t, d)
	data := randomData(rand.New(rand.NewPCG(3, 3)), gpu.Int32, 9)
	in := upload(t, d, data)
	out := upload(t, d, make([]byte, len(data)))
	done := mustEvent(t, d)
	// The producer's allreduce cannot finish before rank 0 joins it.
	if err := rs[1].comm.AllReduce(in, in, 9, gpu.Int32, gpu.Max, producer); err != nil {
		t.Fatal(err)
	}
	if err := producer.Record(done); err != nil {
		t.Fatal(err)
	}
	if err := consumer.WaitEvent(done); err != nil {
		t.Fatal(err)
	}
	if err := consumer.CopyAsync(out, in, len(data)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := consumer.Synchronize(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("consumer ran before the producer's event: %v", err)
	}
	if ok, err := done.Query(); ok || err != nil {
		t.Fatalf("event complete before its work: %v %v", ok, err)
	}
	zero := upload(t, rs[0].dev, make([]byte, len(data)))
	if err := rs[0].comm.AllReduce(zero, zero, 9, gpu.Int32, gpu.Max, rs[0].s); err != nil {
		t.Fatal(err)
	}
	if err := consumer.Synchronize(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if ok, err := done.Query(); !ok || err != nil {
		t.Fatalf("event after the consumer finished: %v %v", ok, err)
	}
	want := ref(gpu.Int32, gpu.Max, [][]byte{make([]byte, len(data)), data})
	if got := download(t, d, out, len(data)); !bytes.Equal(got, want) {
		t.Fatalf("consumer copied %x, want %x", got, want)
	}
	// torch's stream, adopted by handle, is the same queue.
	wrapped, err := d.WrapStream(consumer.(*Stream).Handle())
	if err != nil {
		t.Fatal(err)
	}
	if err := wrapped.Destroy(); err != nil {
		t.Fatal(err)
	}
	if err := consumer.CopyAsync(out, in, 4); err != nil {
		t.Fatalf("destroying an adopted stream destroyed its owner's: %v", err)
	}
}

func mustStream(t *testing.T, d *Device) gpu.Stream {
	t.Helper()
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Destroy() })
	return s
}

func mustEvent(t *testing.T, d *Device) gpu.Event {
	t.Helper()
	e, err := d.NewEvent()
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestSplit(t *testing.T) {
	rs := newRanks(t, 5)
	// Colors by parity, rank 4 left out; keys reverse the order.
	color := func(r int) int {
		if r == 4 {
			return gpu.NoColor
		}
		return r % 2
	}
	errs := parallel(5, func(r int) error {
		sub, err := rs[r].comm.(gpu.Splitter).Split(testCtx(t), color(r), -r)
		if err != nil {
			return err
		}
		if color(r) == gpu.NoColor {
			if sub != nil {
				return fmt.Errorf("rank %d without color got a communicator", r)
			}
			return nil
		}
		if sub.Size() != 2 || sub.Rank() != 1-r/2 {
			return fmt.Errorf("rank %d: sub rank %d of %d, want %d of 2", r, sub.Rank(), sub.Size(), 1-r/2)
		}
		buf := upload(t, rs[r].dev, []byte{byte(r + 1)})
		if err := sub.AllReduce(buf, buf, 1, gpu.Uint8, gpu.Sum, rs[r].s); err != nil {
			return err
		}
		if err := rs[r].s.Synchronize(testCtx(t)); err != nil {
			return err
		}
		want := byte(r%2 + 1 + r%2 + 3) // ranks {0,2} -> 1+3, {1,3} -> 2+4
		if got := download(t, rs[r].dev, buf, 1)[0]; got != want {
			return fmt.Errorf("rank %d: sub allreduce %d, want %d", r, got, want)
		}
		return nil
	})
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}

// Ranks that disagree are the engine's bug; NCCL would corrupt or hang, the fake says so.
func TestMismatchIsAnError(t *testing.T) {
	rs := newRanks(t, 2)
	errs := parallel(2, func(r int) error {
		buf := upload(t, rs[r].dev, make([]byte, 16))
		if err := rs[r].comm.AllReduce(buf, buf, 2+r, gpu.Float32, gpu.Sum, rs[r].s); err != nil {
			return err
		}
		if err := rs[r].s.Synchronize(testCtx(t)); err != nil {
			return err
		}
		if err := rs[r].comm.AsyncError(); err == nil {
			return fmt.Errorf("rank %d: no error for mismatched counts", r)
		}
		return nil
	})
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}

func TestBadArguments(t *testing.T) {
	rs := newRanks(t, 2)
	d := rs[0].dev
	small := upload(t, d, make([]byte, 4))
	other := upload(t, rs[1].dev, make([]byte, 64))
	c, s := rs[0].comm, rs[0].s
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"past the end", c.AllReduce(small, small, 2, gpu.Float32, gpu.Sum, s)},
		{"another device's memory", c.AllReduce(other, other, 1, gpu.Float32, gpu.Sum, s)},
		{"bad root", c.Broadcast(small, small, 1, gpu.Float32, 2, s)},
		{"bad op", c.AllReduce(small, small, 1, gpu.Float32, gpu.RedOp(9), s)},
		{"send outside a group", c.Send(small, 1, gpu.Float32, 1, s)},
		{"unmatched GroupEnd", c.GroupEnd()},
		{"copy past the end", s.CopyAsync(small, small, 8)},
		{"free of an offset", d.Free(small.Add(1))},
		{"alltoall with one count for two ranks", gpu.AllToAll(c, small, []int{1}, []int{0}, small, []int{1}, []int{0}, gpu.Float32, s)},
	} {
		if tc.err == nil {
			t.Errorf("%s: no error", tc.name)
		}
	}
}
