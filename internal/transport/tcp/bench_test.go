package tcp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/collective"
	"github.com/kolo-dl/kolo/internal/dtype"
	"github.com/kolo-dl/kolo/internal/endpoint"
	"github.com/kolo-dl/kolo/internal/reduce"
)

// TestNoAllocs checks the hot path: Send, Recv and SendRecv allocate nothing per call, with or
// without a cancellable ctx.
func TestNoAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	w := connectAll(t, 2, 2, 4096)
	a, b := w.ms[0].Comm(), w.ms[1].Comm()
	sb, rb := make([]byte, 20000), make([]byte, 20000)
	sb2, rb2 := make([]byte, 20000), make([]byte, 20000)
	cctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, ctx := range []context.Context{context.Background(), cctx} {
		const runs = 200
		done := make(chan error, 1)
		go func() {
			for range runs + 1 { // AllocsPerRun does one warm-up call
				if err := b.SendRecv(ctx, 0, sb2, 0, rb2); err != nil {
					done <- err
					return
				}
				if err := b.Send(ctx, 0, sb2[:5000]); err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
		allocs := testing.AllocsPerRun(runs, func() {
			if err := a.SendRecv(ctx, 1, sb, 1, rb); err != nil {
				t.Fatal(err)
			}
			if err := a.Recv(ctx, 1, rb[:5000]); err != nil {
				t.Fatal(err)
			}
		})
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if allocs > 0.05 {
			t.Errorf("ctx %v: %.2f allocations per SendRecv+Send/Recv, want 0", ctx, allocs)
		}
	}
}

// BenchmarkSend measures one-way throughput between 2 ranks in one process over loopback, with
// warm buffers: rank 0 Sends, rank 1 Recvs.
func BenchmarkSend(b *testing.B) {
	for _, streams := range []int{1, 2, 4} {
		w := connectAll(b, 2, streams, ChunkSize)
		for _, size := range []int{4 << 10, 64 << 10, 1 << 20, 8 << 20, 64 << 20} {
			b.Run(fmt.Sprintf("streams=%d/size=%s", streams, human(size)), func(b *testing.B) {
				sb, rb := make([]byte, size), make([]byte, size)
				for i := range sb {
					sb[i], rb[i] = byte(i), byte(i)
				}
				ctx := context.Background()
				done := make(chan error, 1)
				go func() {
					for range b.N {
						if err := w.ms[1].Comm().Recv(ctx, 0, rb); err != nil {
							done <- err
							return
						}
					}
					done <- nil
				}()
				b.SetBytes(int64(size))
				b.ResetTimer()
				for range b.N {
					if err := w.ms[0].Comm().Send(ctx, 1, sb); err != nil {
						b.Fatal(err)
					}
				}
				if err := <-done; err != nil {
					b.Fatal(err)
				}
			})
		}
	}
}

// BenchmarkPingPong measures the round trip of a small message, the latency floor of a collective.
func BenchmarkPingPong(b *testing.B) {
	w := connectAll(b, 2, 2, ChunkSize)
	cctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, c := range []struct {
		name string
		ctx  context.Context
	}{{"background", context.Background()}, {"cancellable", cctx}} {
		b.Run(c.name, func(b *testing.B) {
			ping, pong := make([]byte, 8), make([]byte, 8)
			done := make(chan error, 1)
			go func() {
				for range b.N {
					if err := w.ms[1].Comm().Recv(c.ctx, 0, pong); err != nil {
						done <- err
						return
					}
					if err := w.ms[1].Comm().Send(c.ctx, 0, pong); err != nil {
						done <- err
						return
					}
				}
				done <- nil
			}()
			for range b.N {
				if err := w.ms[0].Comm().Send(c.ctx, 1, ping); err != nil {
					b.Fatal(err)
				}
				if err := w.ms[0].Comm().Recv(c.ctx, 1, ping); err != nil {
					b.Fatal(err)
				}
			}
			if err := <-done; err != nil {
				b.Fatal(err)
			}
		})
	}
}

func human(n int) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprint(n)
}

// BenchmarkAllreduce runs collective.Allreduce between 2 ranks in one process over loopback, with
// warm buffers: 4 bytes (recursive doubling, the latency floor) and 4 MiB (the ring, striped over
// the default 2 streams).
func BenchmarkAllreduce(b *testing.B) {
	w := connectAll(b, 2, DefaultStreams, ChunkSize)
	for _, size := range []int{4, 4 << 20} {
		b.Run(fmt.Sprintf("size=%s", human(size)), func(b *testing.B) {
			bufs := [][]byte{make([]byte, size), make([]byte, size)}
			ctx := context.Background()
			start, done := make(chan struct{}), make(chan error, 1)
			go func() {
				for range start {
					done <- collective.Allreduce(ctx, w.ms[1].Comm(), bufs[1], dtype.Float32, reduce.Sum, nil)
				}
			}()
			defer close(start)
			run := func() {
				start <- struct{}{}
				if err := collective.Allreduce(ctx, w.ms[0].Comm(), bufs[0], dtype.Float32, reduce.Sum, nil); err != nil {
					b.Fatal(err)
				}
				if err := <-done; err != nil {
					b.Fatal(err)
				}
			}
			run() // warm buffers and the scratch pool
			b.SetBytes(int64(size))
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				run()
			}
		})
	}
}

// BenchmarkStranger measures what a stranger's connection costs the process it reaches: dial, 70
// bytes of noise (what bench/churn.py sends), read until the listener hangs up. "bare" is a
// listener that closes what it accepts, the least any server does (the kernel's accept and
// close); "rank" is a rank's Listener, which fails the stranger's handshake and counts it at its
// gate. cpu-us/op is this process's user and system CPU per connection, both ends together: the
// difference between the rows is what a rank spends on a stranger beyond the kernel's floor.
//
//	go test -run '^$' -bench Stranger -benchtime 20000x -count 5 ./internal/transport/tcp/
func BenchmarkStranger(b *testing.B) {
	noise := make([]byte, 70)
	for i := range noise {
		noise[i] = byte(i*37 + 11)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, network := range []string{"tcp", "unix"} {
		for _, kind := range []string{"bare", "rank"} {
			b.Run(network+"/"+kind, func(b *testing.B) {
				addr := "127.0.0.1:0"
				if network == "unix" {
					addr = filepath.Join(b.TempDir(), "r.sock")
				}
				var at string
				if kind == "bare" {
					ln, err := endpoint.Listen(addr)
					if err != nil {
						b.Fatal(err)
					}
					defer ln.Close()
					go func() {
						for {
							c, err := ln.Accept()
							if err != nil {
								return
							}
							c.Close()
						}
					}()
					at = endpoint.String(ln.Addr())
				} else {
					l, err := listen(addr, testSecret, quiet, HandshakeTimeout)
					if err != nil {
						b.Fatal(err)
					}
					defer l.Close()
					at = endpoint.String(l.Addr())
				}
				ctx := context.Background()
				var before syscall.Rusage
				syscall.Getrusage(syscall.RUSAGE_SELF, &before)
				b.ResetTimer()
				for range b.N {
					c, err := endpoint.Dial(ctx, at)
					if err != nil {
						b.Fatal(err)
					}
					c.Write(noise)
					c.SetReadDeadline(time.Now().Add(5 * time.Second))
					if _, err := io.Copy(io.Discard, c); err != nil && !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
						b.Fatalf("reading until the listener hung up: %v", err)
					}
					if t, ok := c.(*net.TCPConn); ok {
						t.SetLinger(0) // no TIME_WAIT left behind to run out of ports
					}
					c.Close()
				}
				b.StopTimer()
				var after syscall.Rusage
				syscall.Getrusage(syscall.RUSAGE_SELF, &after)
				cpu := time.Duration(after.Utime.Nano() - before.Utime.Nano() + after.Stime.Nano() - before.Stime.Nano())
				b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-us/op")
			})
		}
	}
}
