package worker

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/dtype"
	"github.com/kolo-dl/kolo/internal/engine"
	"github.com/kolo-dl/kolo/internal/engine/negotiate"
	"github.com/kolo-dl/kolo/internal/jobenv"
	"github.com/kolo-dl/kolo/internal/rendezvous"
	"github.com/kolo-dl/kolo/internal/world"
)

// leakRendezvousEnv makes the test binary serve a rendezvous (TestLeakRendezvousHelper) for
// TestElasticReformLeaksNothing: in the measured process its records, which a real job keeps in
// the launcher, would grow the heap with every round.
const leakRendezvousEnv = "WORKER_LEAK_TEST_RENDEZVOUS_SECRET"

// TestLeakRendezvousHelper is the rendezvous process of TestElasticReformLeaksNothing: it prints
// its address and serves until its stdin closes.
func TestLeakRendezvousHelper(t *testing.T) {
	secret := os.Getenv(leakRendezvousEnv)
	if secret == "" {
		t.Skip("the rendezvous process of TestElasticReformLeaksNothing")
	}
	srv := rendezvous.NewServer([]byte(secret))
	addr, err := srv.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fmt.Println(addr)
	buf := make([]byte, 1)
	os.Stdin.Read(buf) // returns when the parent closes the pipe or exits
	srv.Close()
}

// An elastic worker that joins, runs and leaves 50 rounds in one process (two workers on one
// host, so each round has a shared-memory group whose collectives measure their slot stores) ends
// with what it had after the first rounds: as many heap objects (after a GC), open files and
// mapped shared-memory segments, and no segment left in the shared-memory directory. Each round's
// world is new (worlds are values); nothing of a closed one may stay reachable.
func TestElasticReformLeaksNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("50 elastic rounds")
	}
	const rounds, warm = 50, 10
	secret := "leak-test-secret-0123456789abcdef0123456789abcdef"
	addr := startLeakRendezvous(t, secret)
	pub, err := rendezvous.Dial(context.Background(), addr, []byte(secret))
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	shmDir := t.TempDir()

	a0, a1 := jobenv.Place{Host: "a", Slot: 0}, jobenv.Place{Host: "a", Slot: 1}
	places := []jobenv.Place{a0, a1}
	mems := []*Memory{{}, {}}
	defer func() {
		for _, m := range mems {
			m.linger(nil)
		}
	}()
	var base footprint
	for n := 1; n <= rounds; n++ {
		r := roundOf(n, n, places...)
		ctx := context.Background()
		if err := pub.Set(ctx, jobenv.RoundKey(n), r.Encode()); err != nil {
			t.Fatal(err)
		}
		if err := pub.Set(ctx, jobenv.LatestRoundKey, []byte(strconv.Itoa(n))); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		errs := make([]error, len(places))
		for i, p := range places {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = leakRound(mems[i], addr, secret, shmDir, p, r.Ranks[i], n)
			}()
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d, %v: %v", n, places[i], err)
			}
		}
		if n == warm {
			base = measure(t, shmDir)
		}
	}
	end := measure(t, shmDir)
	t.Logf("after round %d: %+v; after round %d: %+v", warm, base, rounds, end)
	// A leak of one object per round would pass; what a world holds (its groups, their
	// goroutines' stacks and buffers) is hundreds, which 40 rounds make thousands.
	if grown := int64(end.heapObjects) - int64(base.heapObjects); grown > 400 {
		t.Errorf("heap objects grew by %d over %d rounds (%d -> %d)", grown, rounds-warm, base.heapObjects, end.heapObjects)
	}
	if end.fds > base.fds {
		t.Errorf("open files grew from %d to %d over %d rounds", base.fds, end.fds, rounds-warm)
	}
	if end.mapped > base.mapped || end.mapped > 0 {
		t.Errorf("segments of %s mapped: %d after round %d, %d after round %d", shmDir, base.mapped, warm, end.mapped, rounds)
	}
	if end.files != 0 {
		t.Errorf("%d segments left in %s", end.files, shmDir)
	}
}

// leakRound is one worker's round n: join it at place p (rank rr), allreduce a few tensors
// large enough for the shared-memory algorithms, check the sums, leave.
func leakRound(mem *Memory, addr, secret, shmDir string, p jobenv.Place, rr jobenv.RoundRank, n int) error {
	env := jobenv.Encode(jobenv.Job{Rank: rr.LocalRank, Size: rr.LocalSize, LocalRank: rr.LocalRank, LocalSize: rr.LocalSize,
		CrossSize: 1, Hostname: p.Host, Rendezvous: addr, JobID: "leak"})
	env[jobenv.Secret] = secret
	env[jobenv.Elastic] = "1"
	env[jobenv.ElasticHost] = p.Host
	env[jobenv.ElasticSlot] = strconv.Itoa(p.Slot)
	env[jobenv.ElasticRound] = "1"
	env[jobenv.ElasticTimeout] = "30"
	w, err := Join(mem, Options{Env: env, Engine: engine.DefaultConfig(), World: world.Options{ShmDir: shmDir}})
	if err != nil {
		return fmt.Errorf("join: %w", err)
	}
	if got := w.ElasticRound(); got != n {
		w.Leave()
		return fmt.Errorf("joined round %d", got)
	}
	const elems = 256 << 10 // 1 MiB of float32
	size := float32(w.Job().Size)
	for i := range 3 {
		buf := make([]byte, 4*elems)
		for k := range elems {
			binary.LittleEndian.PutUint32(buf[4*k:], math.Float32bits(float32(k%7)))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		h := w.Engine().Enqueue(negotiate.Request{Name: fmt.Sprintf("grad%d", i), Kind: negotiate.Allreduce,
			DType: dtype.Float32, Shape: []int64{elems}, ReduceOp: negotiate.ReduceSum}, buf, buf)
		err := h.Wait(ctx)
		cancel()
		if err != nil {
			w.Leave()
			return fmt.Errorf("allreduce %d: %w", i, err)
		}
		for k := range elems {
			if got := math.Float32frombits(binary.LittleEndian.Uint32(buf[4*k:])); got != size*float32(k%7) {
				w.Leave()
				return fmt.Errorf("allreduce %d: element %d is %v, want %v", i, k, got, size*float32(k%7))
			}
		}
	}
	if err := w.Leave(); err != nil {
		return fmt.Errorf("leave: %w", err)
	}
	return nil
}

// startLeakRendezvous runs TestLeakRendezvousHelper in a child process and returns its address.
func startLeakRendezvous(t *testing.T, secret string) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestLeakRendezvousHelper$")
	cmd.Env = append(os.Environ(), leakRendezvousEnv+"="+secret)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		cmd.Wait()
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("the rendezvous process said no address: %v", err)
	}
	return strings.TrimSpace(line)
}

// footprint is what the process holds that a leaked world would grow.
type footprint struct {
	heapObjects uint64 // live heap objects after a GC
	fds         int    // entries of /proc/self/fd
	mapped      int    // mappings of files in the shared-memory directory (/proc/self/maps)
	files       int    // entries of the shared-memory directory
}

func measure(t *testing.T, shmDir string) footprint {
	t.Helper()
	var f footprint
	// Goroutines of the closed world that are still on their way out (a reader woken by the
	// close) hold its objects a moment longer: settle before counting.
	for range 3 {
		runtime.GC()
		time.Sleep(50 * time.Millisecond)
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	f.heapObjects = ms.HeapObjects
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	f.fds = len(fds)
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(maps), "\n") {
		if strings.Contains(line, filepath.Clean(shmDir)+"/") {
			f.mapped++
		}
	}
	files, err := os.ReadDir(shmDir)
	if err != nil {
		t.Fatal(err)
	}
	f.files = len(files)
	return f
}
