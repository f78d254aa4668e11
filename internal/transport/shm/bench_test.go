//go:build linux

package shm

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/transport"
)

// Benchmarks use /dev/shm and the default sizes (1 MiB rings), like a real job. Buffers are
// allocated and touched before the timer starts: these are warm-buffer numbers.

// KOLO_SHM_BENCH_SPIN overrides Config.Spin (e.g. "-1ns" or "20us") to compare spin budgets.
func benchConfig(b *testing.B, size int) Config {
	spin, _ := time.ParseDuration(os.Getenv("KOLO_SHM_BENCH_SPIN"))
	return Config{Name: fmt.Sprintf("kolo-bench-%d-%d", os.Getpid(), segCounter.Add(1)), Size: size,
		Timeout: 10 * time.Second, Spin: spin}
}

// BenchmarkPingPong is a 4-byte round trip between two ranks of one process (two goroutines);
// ns/op is one round trip, two hops.
func BenchmarkPingPong(b *testing.B) {
	for _, spin := range []time.Duration{5 * time.Microsecond, -1} {
		b.Run(fmt.Sprintf("spin=%v", spin), func(b *testing.B) {
			cfg := benchConfig(b, 2)
			cfg.Spin = spin
			gs := openAll(b, cfg)
			ctx := context.Background()
			done := make(chan error, 1)
			go func() {
				c, buf := gs[1].Comm(), make([]byte, 4)
				for range b.N {
					if err := c.Recv(ctx, 0, buf); err != nil {
						done <- err
						return
					}
					if err := c.Send(ctx, 0, buf); err != nil {
						done <- err
						return
					}
				}
				done <- nil
			}()
			c, buf := gs[0].Comm(), make([]byte, 4)
			b.ResetTimer()
			for range b.N {
				if err := c.Send(ctx, 1, buf); err != nil {
					b.Fatal(err)
				}
				if err := c.Recv(ctx, 1, buf); err != nil {
					b.Fatal(err)
				}
			}
			if err := <-done; err != nil {
				b.Fatal(err)
			}
		})
	}
}

// BenchmarkPingPongProcess is the same round trip with rank 1 in a child process, reported per
// one-way hop, for several spin budgets (-1: always sleep on the futex).
func BenchmarkPingPongProcess(b *testing.B) {
	for _, spin := range []time.Duration{-1, 5 * time.Microsecond, 50 * time.Microsecond} {
		b.Run(fmt.Sprintf("spin=%v", spin), func(b *testing.B) {
			g, cmd := startChild(b, "echo", spin)
			defer func() {
				cmd.Process.Kill()
				cmd.Wait()
			}()
			b.ResetTimer()
			hop, err := pingPong(g.Comm(), b.N)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(hop.Nanoseconds()), "ns/hop")
		})
	}
}

// BenchmarkStream is one-way throughput: rank 0 Sends n bytes that rank 1 Recvs (two copies
// through the 1 MiB ring).
func BenchmarkStream(b *testing.B) {
	for _, n := range []int{4 << 20, 64 << 20} {
		b.Run(fmt.Sprintf("%dMiB", n>>20), func(b *testing.B) {
			gs := openAll(b, benchConfig(b, 2))
			ctx := context.Background()
			src, dst := make([]byte, n), make([]byte, n)
			for i := range src {
				src[i] = byte(i)
			}
			copy(dst, src)
			done := make(chan error, 1)
			b.SetBytes(int64(n))
			b.ResetTimer()
			go func() {
				for range b.N {
					if err := gs[1].Comm().Recv(ctx, 0, dst); err != nil {
						done <- err
						return
					}
				}
				done <- nil
			}()
			for range b.N {
				if err := gs[0].Comm().Send(ctx, 1, src); err != nil {
					b.Fatal(err)
				}
			}
			if err := <-done; err != nil {
				b.Fatal(err)
			}
		})
	}
}

// BenchmarkRingExchange has every rank SendRecv n bytes around a ring at once; with 8 ranks on 2
// cores it measures the oversubscribed case. Throughput counts the bytes each rank sends.
func BenchmarkRingExchange(b *testing.B) {
	for _, size := range []int{2, 8} {
		b.Run(fmt.Sprintf("ranks=%d/4MiB", size), func(b *testing.B) {
			const n = 4 << 20
			gs := openAll(b, benchConfig(b, size))
			ctx := context.Background()
			bufs := make([][2][]byte, size)
			for r := range bufs {
				bufs[r] = [2][]byte{make([]byte, n), make([]byte, n)}
				copy(bufs[r][0], bufs[r][1])
			}
			b.SetBytes(n)
			b.ResetTimer()
			runAll(b, gs, func(r int, g *Group) error {
				c := g.Comm()
				for range b.N {
					if err := c.SendRecv(ctx, (r+1)%size, bufs[r][0], (r+size-1)%size, bufs[r][1]); err != nil {
						return err
					}
				}
				return nil
			})
		})
	}
}

func BenchmarkBarrier(b *testing.B) {
	for _, size := range []int{2, 8} {
		b.Run(fmt.Sprintf("ranks=%d", size), func(b *testing.B) {
			gs := openAll(b, benchConfig(b, size))
			ctx := context.Background()
			b.ResetTimer()
			runAll(b, gs, func(r int, g *Group) error {
				sh := g.Comm().(transport.Shared)
				for range b.N {
					if err := sh.Barrier(ctx); err != nil {
						return err
					}
				}
				return nil
			})
		})
	}
}

// BenchmarkOpen is the cost of attaching 2 ranks with default sizes (fallocate plus populate).
func BenchmarkOpen(b *testing.B) {
	for range b.N {
		gs := openAll(b, benchConfig(b, 2))
		for _, g := range gs {
			g.Close()
		}
	}
}

// BenchmarkCallOverhead is the fixed cost of a 4-byte Send plus the matching Recv when neither
// waits (one goroutine plays both ranks).
func BenchmarkCallOverhead(b *testing.B) {
	gs := openAll(b, benchConfig(b, 2))
	ctx := context.Background()
	buf := make([]byte, 4)
	c0, c1 := gs[0].Comm(), gs[1].Comm()
	b.ReportAllocs()
	for range b.N {
		if err := c0.Send(ctx, 1, buf); err != nil {
			b.Fatal(err)
		}
		if err := c1.Recv(ctx, 0, buf); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkProcesses runs every rank in its own process (rank 0 here, the rest re-executed test
// binaries): the deployment shape, where the OS rather than the Go scheduler shares the cores.
func BenchmarkProcesses(b *testing.B) {
	spin, _ := time.ParseDuration(os.Getenv("KOLO_SHM_BENCH_SPIN"))
	for _, size := range []int{2, 8} {
		b.Run(fmt.Sprintf("barrier/ranks=%d", size), func(b *testing.B) {
			g, cmds := startRanks(b, "barrier", size, b.N, spin)
			sh := g.Comm().(transport.Shared)
			ctx := context.Background()
			if err := sh.Barrier(ctx); err != nil { // everyone started
				b.Fatal(err)
			}
			b.ResetTimer()
			for range b.N - 1 {
				if err := sh.Barrier(ctx); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			waitAll(b, cmds)
		})
		b.Run(fmt.Sprintf("ring/ranks=%d/4MiB", size), func(b *testing.B) {
			g, cmds := startRanks(b, "ring", size, b.N, spin)
			b.SetBytes(ringBytes)
			b.ResetTimer()
			if err := ringExchange(context.Background(), g.Comm(), b.N); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			waitAll(b, cmds)
		})
	}
}

func waitAll(b *testing.B, cmds []*exec.Cmd) {
	for _, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			b.Fatalf("child rank: %v", err)
		}
	}
}
