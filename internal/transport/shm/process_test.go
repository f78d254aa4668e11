//go:build linux

package shm

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/transport"
)

// The cross-process tests re-execute the test binary as local rank 1; TestMain sends it to
// childMain instead of the tests.
const (
	envChild = "KOLO_SHM_TEST_CHILD"
	envDir   = "KOLO_SHM_TEST_DIR"
	envName  = "KOLO_SHM_TEST_NAME"
	envSpin  = "KOLO_SHM_TEST_SPIN"
	envRank  = "KOLO_SHM_TEST_RANK"
	envSize  = "KOLO_SHM_TEST_SIZE"
	envIters = "KOLO_SHM_TEST_ITERS"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(envChild); mode != "" {
		if err := childMain(mode); err != nil {
			fmt.Fprintln(os.Stderr, "shm test child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

var stopWord = []byte{0xff, 0xff, 0xff, 0xff}

const bulkBytes = 5<<20 + 3

func childMain(mode string) error {
	spin, _ := time.ParseDuration(os.Getenv(envSpin))
	rank, size, iters := 1, 2, 0
	if v := os.Getenv(envRank); v != "" {
		rank, _ = strconv.Atoi(v)
		size, _ = strconv.Atoi(os.Getenv(envSize))
		iters, _ = strconv.Atoi(os.Getenv(envIters))
	}
	cfg := Config{Name: os.Getenv(envName), Dir: os.Getenv(envDir), Rank: rank, Size: size, Spin: spin, Timeout: 10 * time.Second}
	ctx := context.Background()
	g, err := Open(ctx, cfg)
	if err != nil {
		return err
	}
	defer g.Close()
	c, m := g.Comm(), g.Messenger()
	switch mode {
	case "barrier":
		for range iters {
			if err := c.(transport.Shared).Barrier(ctx); err != nil {
				return err
			}
		}
		return nil
	case "ring":
		return ringExchange(ctx, c, iters)
	case "echo":
		// Ping-pong until the stop word, then echo one bulk transfer, then one message exchange.
		b := make([]byte, 4)
		for {
			if err := c.Recv(ctx, 0, b); err != nil {
				return err
			}
			if bytes.Equal(b, stopWord) {
				break
			}
			if err := c.Send(ctx, 0, b); err != nil {
				return err
			}
		}
		bulk := make([]byte, bulkBytes)
		if err := c.Recv(ctx, 0, bulk); err != nil {
			return err
		}
		if err := c.Send(ctx, 0, bulk); err != nil {
			return err
		}
		if err := m.SendMsg(ctx, 0, []byte("hello from rank 1")); err != nil {
			return err
		}
		in := <-m.Inbox()
		if string(in.Body) != "bye" {
			return fmt.Errorf("child got message %+v", in)
		}
		return nil
	case "hang":
		if err := m.SendMsg(ctx, 0, []byte("ready")); err != nil {
			return err
		}
		// Wait for bytes that never come, until the parent kills this process.
		return c.Recv(ctx, 0, make([]byte, 100))
	}
	return fmt.Errorf("unknown child mode %q", mode)
}

// ringExchange does iters SendRecvs of ringBytes around the ring of ranks.
func ringExchange(ctx context.Context, c transport.Comm, iters int) error {
	r, n := c.Rank(), c.Size()
	sb, rb := make([]byte, ringBytes), make([]byte, ringBytes)
	copy(sb, rb)
	for range iters {
		if err := c.SendRecv(ctx, (r+1)%n, sb, (r+n-1)%n, rb); err != nil {
			return err
		}
	}
	return nil
}

const ringBytes = 4 << 20

// startRanks starts local ranks 1..size-1 as child processes in mode, each doing iters
// iterations, and opens rank 0 here.
func startRanks(t testing.TB, mode string, size, iters int, spin time.Duration) (*Group, []*exec.Cmd) {
	t.Helper()
	cfg := Config{Name: fmt.Sprintf("kolo-proc-test-%d-%d", os.Getpid(), segCounter.Add(1)),
		Size: size, Spin: spin, Timeout: 20 * time.Second}
	var cmds []*exec.Cmd
	for r := 1; r < size; r++ {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), envChild+"="+mode, envDir+"="+cfg.Dir, envName+"="+cfg.Name,
			envSpin+"="+spin.String(), envRank+"="+strconv.Itoa(r), envSize+"="+strconv.Itoa(size),
			envIters+"="+strconv.Itoa(iters))
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatalf("start rank %d: %v", r, err)
		}
		cmds = append(cmds, cmd)
	}
	t.Cleanup(func() {
		for _, cmd := range cmds {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	g, err := Open(context.Background(), cfg)
	if err != nil {
		t.Fatalf("open rank 0 with %d child ranks: %v", size-1, err)
	}
	t.Cleanup(func() { g.Close() })
	return g, cmds
}

// startChild starts local rank 1 in a child process and opens rank 0 here.
func startChild(t testing.TB, mode string, spin time.Duration) (*Group, *exec.Cmd) {
	t.Helper()
	cfg := Config{Name: fmt.Sprintf("kolo-proc-test-%d-%d", os.Getpid(), segCounter.Add(1)), Dir: t.TempDir(),
		Size: 2, Spin: spin, Timeout: 20 * time.Second}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envChild+"="+mode, envDir+"="+cfg.Dir, envName+"="+cfg.Name, envSpin+"="+spin.String())
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start child rank: %v", err)
	}
	g, err := Open(context.Background(), cfg)
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("open rank 0 with a child rank 1: %v", err)
	}
	t.Cleanup(func() { g.Close() })
	return g, cmd
}

// pingPong returns the mean one-way hop of n 4-byte round trips with the echoing child.
func pingPong(c transport.Comm, n int) (time.Duration, error) {
	ctx := context.Background()
	out, in := make([]byte, 4), make([]byte, 4)
	start := time.Now()
	for i := range n {
		binary.LittleEndian.PutUint32(out, uint32(i))
		if err := c.Send(ctx, 1, out); err != nil {
			return 0, err
		}
		if err := c.Recv(ctx, 1, in); err != nil {
			return 0, err
		}
		if !bytes.Equal(in, out) {
			return 0, fmt.Errorf("round trip %d: sent %x, got back %x", i, out, in)
		}
	}
	return time.Since(start) / time.Duration(2*n), nil
}

func TestCrossProcess(t *testing.T) {
	for _, tc := range []struct {
		name  string
		spin  time.Duration
		trips int
	}{
		{"spin", 5 * time.Microsecond, 5000},
		{"futex only", -1, 1000}, // every hop must be woken by a FUTEX_WAKE from the other process
	} {
		t.Run(tc.name, func(t *testing.T) {
			if testing.Short() {
				tc.trips /= 10
			}
			g, cmd := startChild(t, "echo", tc.spin)
			c, m := g.Comm(), g.Messenger()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			hop, err := pingPong(c, tc.trips)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("cross-process 4-byte ping-pong, spin %v: %v per one-way hop (%d round trips)", tc.spin, hop, tc.trips)
			// Without working cross-process wake-ups every hop would wait out the 50 ms poll.
			if hop > 5*time.Millisecond {
				t.Fatalf("mean hop %v: futex wake-ups across processes are not working", hop)
			}
			if err := c.Send(ctx, 1, stopWord); err != nil {
				t.Fatal(err)
			}
			bulk := payload(0, 1, 9, bulkBytes)
			back := make([]byte, bulkBytes)
			if err := c.SendRecv(ctx, 1, bulk, 1, back); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(back, bulk) {
				t.Fatal("bulk echo differs")
			}
			select {
			case in := <-m.Inbox():
				if in.From != 1 || string(in.Body) != "hello from rank 1" {
					t.Fatalf("message from the child: %+v", in)
				}
			case <-ctx.Done():
				t.Fatal("no message from the child")
			}
			if err := m.SendMsg(ctx, 1, []byte("bye")); err != nil {
				t.Fatal(err)
			}
			if err := cmd.Wait(); err != nil {
				t.Fatalf("child rank: %v", err)
			}
		})
	}
}

// TestKilledPeer kills the child with SIGKILL while both wait on each other and leaves it
// unreaped, a zombie that kill(pid, 0) still finds: the parent's Recv must fail anyway, naming it.
func TestKilledPeer(t *testing.T) {
	g, cmd := startChild(t, "hang", 0)
	defer cmd.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m := g.Messenger()
	if in := <-m.Inbox(); string(in.Body) != "ready" {
		t.Fatalf("child's first message: %+v", in)
	}
	done := make(chan error, 1)
	go func() { done <- g.Comm().Recv(ctx, 1, make([]byte, 8)) }()
	time.Sleep(100 * time.Millisecond) // both sides asleep in Recv
	start := time.Now()
	if err := cmd.Process.Signal(os.Kill); err != nil {
		t.Fatal(err)
	}
	var err error
	select {
	case err = <-done:
	case <-time.After(2 * time.Second):
		t.Fatal("recv from a killed peer did not fail within 2 s")
	}
	took := time.Since(start)
	var pe *transport.PeerError
	if !errors.As(err, &pe) || pe.Rank != 1 || pe.Op != "recv" || !errors.Is(err, transport.ErrPeerLost) ||
		!bytes.Contains([]byte(err.Error()), []byte("process "+strconv.Itoa(cmd.Process.Pid))) {
		t.Fatalf("recv from a killed peer: %v", err)
	}
	t.Logf("recv failed %v after kill -9: %v", took, err)
	select {
	case in := <-m.Inbox():
		if in.From != 1 || in.Body != nil || m.Lost(1) == nil {
			t.Fatalf("messenger after the kill: %+v, lost %v", in, m.Lost(1))
		}
	case <-time.After(2 * time.Second):
		t.Fatal("messenger did not report the killed peer lost")
	}
}
