package engine

import (
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/engine/negotiate"
	"github.com/kolo-dl/kolo/internal/transport"
	"github.com/kolo-dl/kolo/internal/transport/inmem"
)

// stoppableMessenger is rank 0's Messenger in these tests: Stop makes it behave as the control lane
// of a stopped process (SIGSTOP), which inmem's Endpoint.Pause leaves running: its sends block and
// nothing reaches its inbox until Cont. It counts the keep-alives it sends.
type stoppableMessenger struct {
	transport.Messenger
	keepAlives atomic.Int32

	mu      sync.Mutex
	stopped chan struct{} // while stopped: closed by Cont
	once    sync.Once
	inbox   chan transport.Msg
	done    chan struct{} // closed at the test's end: the forwarder leaves
}

func (m *stoppableMessenger) Stop() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stopped == nil {
		m.stopped = make(chan struct{})
	}
}

func (m *stoppableMessenger) Cont() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stopped != nil {
		close(m.stopped)
		m.stopped = nil
	}
}

// hold blocks while the process is stopped.
func (m *stoppableMessenger) hold(ctx context.Context) error {
	m.mu.Lock()
	c := m.stopped
	m.mu.Unlock()
	if c == nil {
		return nil
	}
	select {
	case <-c:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-m.done:
		return transport.ErrClosed
	}
}

func (m *stoppableMessenger) SendMsg(ctx context.Context, peer int, body []byte) error {
	if err := m.hold(ctx); err != nil {
		return err
	}
	if k, err := negotiate.PeekKind(body); err == nil && k == negotiate.MsgKeepAlive {
		m.keepAlives.Add(1)
	}
	return m.Messenger.SendMsg(ctx, peer, body)
}

func (m *stoppableMessenger) Inbox() <-chan transport.Msg {
	m.once.Do(func() {
		m.inbox = make(chan transport.Msg, 64) // as a connection buffers, so that a step reads all that came
		in := m.Messenger.Inbox()
		go func() {
			defer close(m.inbox)
			for msg := range in {
				if m.hold(context.Background()) != nil {
					return
				}
				select {
				case m.inbox <- msg:
				case <-m.done:
					return
				}
			}
		}()
	})
	return m.inbox
}

// keepAliveCluster is n engines over inmem with progress timeout limit (on the engines and the
// transport) whose rank 0 talks through the returned stoppableMessenger.
func keepAliveCluster(t *testing.T, n int, limit time.Duration) (*cluster, *stoppableMessenger) {
	captureLog(t)
	cfg := DefaultConfig()
	cfg.ProgressTimeout = limit
	var opts []inmem.Option
	if limit > 0 {
		opts = append(opts, inmem.WithProgressTimeout(limit))
	}
	m := &stoppableMessenger{done: make(chan struct{})}
	c := newClusterWith(t, n, cfg, opts, func(r int, ep *inmem.Endpoint, g *Group) {
		if r == 0 {
			m.Messenger = g.Messenger
			g.Messenger = m
		}
	})
	t.Cleanup(func() { // before the cluster shuts down
		m.Cont()
		c.eps[0].Resume()
		close(m.done)
	})
	return c, m
}

// stopCoordinator stops rank 0's process, as SIGSTOP does: its control lane and its collectives.
func stopCoordinator(c *cluster, m *stoppableMessenger) {
	m.Stop()
	c.eps[0].Pause()
}

func contCoordinator(c *cluster, m *stoppableMessenger) {
	m.Cont()
	c.eps[0].Resume()
}

// allreduceOn submits one allreduce of one float on each of ranks, at once, and reports each
// rank's result on the channel.
func allreduceOn(ctx context.Context, c *cluster, name string, ranks ...int) <-chan ranked {
	out := make(chan ranked, len(ranks))
	for _, r := range ranks {
		go func() {
			buf := f32(float32(r + 1))
			start := time.Now()
			err := c.engines[r].Enqueue(allreduceReq(name, 1), buf, buf).Wait(ctx)
			out <- ranked{r, err, buf, time.Since(start)}
		}()
	}
	return out
}

// warmUp runs one allreduce on every rank, so that later ops are submitted between ops.
func warmUp(t *testing.T, c *cluster) {
	t.Helper()
	ranks := make([]int, len(c.engines))
	for r := range ranks {
		ranks[r] = r
	}
	results := allreduceOn(waitCtx(t), c, "warm-up", ranks...)
	for range ranks {
		if res := <-results; res.err != nil {
			t.Fatalf("rank %d: warm-up: %v", res.rank, res.err)
		}
	}
}

// A coordinator stopped between ops (its ranks submitted theirs, it answers nothing) fails the
// ranks that wait on it after the progress timeout, each naming rank 0, its host and the op; once
// it runs again it stops too, naming itself, from the ranks' notices.
func TestStoppedCoordinatorFailsWaitingRanks(t *testing.T) {
	const n, limit = 3, 300 * time.Millisecond
	c, m := keepAliveCluster(t, n, limit)
	warmUp(t, c)
	stopCoordinator(c, m)
	results := allreduceOn(waitCtx(t), c, "grad.w", 1, 2)
	want := []string{"rank 0 (memhost) made no progress for 300ms", `it coordinates process set 0 and has not answered allreduce "grad.w" submitted`}
	for range n - 1 {
		var res ranked
		select {
		case res = <-results:
		case <-time.After(5 * limit):
			t.Fatalf("ranks still wait on the stopped coordinator after %v", 5*limit)
		}
		for _, w := range want {
			if res.err == nil || !strings.Contains(res.err.Error(), w) {
				t.Errorf("rank %d: err = %v, want one with %q", res.rank, res.err, w)
			}
		}
		if res.took < limit || res.took > limit*3/2+100*time.Millisecond {
			t.Errorf("rank %d failed after %v, want within %v of the %v deadline", res.rank, res.took, limit/2+100*time.Millisecond, limit)
		}
	}
	contCoordinator(c, m)
	deadline := time.Now().Add(5 * time.Second)
	for c.engines[0].Err() == nil && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if err := c.engines[0].Err(); err == nil || !strings.Contains(err.Error(), want[0]) {
		t.Errorf("resumed coordinator: err = %v, want one with %q", err, want[0])
	}
}

// A coordinator stopped for most of the timeout costs nothing: the ranks that waited on it go on
// waiting, on its keep-alives, until it submits the op itself, long after their deadline would
// have passed without them.
func TestCoordinatorResumesBeforeDeadline(t *testing.T) {
	const n, limit = 3, 300 * time.Millisecond
	c, m := keepAliveCluster(t, n, limit)
	warmUp(t, c)
	stopCoordinator(c, m)
	ctx := waitCtx(t)
	results := allreduceOn(ctx, c, "grad.w", 1, 2)
	// Half the timeout: a stopped process's keep-alive ticker fires at once when it runs again, but
	// this one's engine ran all along and spent its ticks; the next one may come a quarter later.
	time.Sleep(limit / 2)
	before := m.keepAlives.Load()
	contCoordinator(c, m)
	time.Sleep(limit) // rank 0 computes; ranks 1 and 2 have waited 1.5 timeouts
	own := allreduceOn(ctx, c, "grad.w", 0)
	for range n {
		var res ranked
		select {
		case res = <-results:
		case res = <-own:
		}
		if res.err != nil {
			t.Fatalf("rank %d: %v", res.rank, res.err)
		}
		if got := getF32(res.buf); got[0] != 1+2+3 {
			t.Errorf("rank %d: sum %v, want 6", res.rank, got[0])
		}
	}
	if m.keepAlives.Load() == before {
		t.Error("the resumed coordinator sent no keep-alive")
	}
}

// A rank slow to submit (computing) for three timeouts fails nobody: the coordinator, alive, keeps
// the ranks that submitted told, whether the slow rank is another or the coordinator itself (its
// caller outside kolo, the background goroutine sending).
func TestSlowRankIsNotAStall(t *testing.T) {
	const n, limit = 3, 200 * time.Millisecond
	for _, slow := range []int{0, 2} {
		t.Run(map[int]string{0: "coordinator", 2: "other"}[slow], func(t *testing.T) {
			c, m := keepAliveCluster(t, n, limit)
			warmUp(t, c)
			ctx := waitCtx(t)
			var prompt []int
			for r := range n {
				if r != slow {
					prompt = append(prompt, r)
				}
			}
			results := allreduceOn(ctx, c, "grad.w", prompt...)
			time.Sleep(3 * limit)
			late := allreduceOn(ctx, c, "grad.w", slow)
			for range n {
				var res ranked
				select {
				case res = <-results:
				case res = <-late:
				}
				if res.err != nil {
					t.Fatalf("rank %d: %v", res.rank, res.err)
				}
			}
			if m.keepAlives.Load() == 0 {
				t.Error("no keep-alive sent while ranks waited")
			}
		})
	}
}

// A negative ProgressTimeout turns the deadline off, and with it the keep-alives: none is sent,
// however long ranks wait on the coordinator.
func TestNoKeepAliveWithoutProgressTimeout(t *testing.T) {
	const n = 3
	c, m := keepAliveCluster(t, n, -1)
	warmUp(t, c)
	ctx := waitCtx(t)
	results := allreduceOn(ctx, c, "grad.w", 1, 2)
	time.Sleep(300 * time.Millisecond)
	late := allreduceOn(ctx, c, "grad.w", 0)
	for range n {
		var res ranked
		select {
		case res = <-results:
		case res = <-late:
		}
		if res.err != nil {
			t.Fatalf("rank %d: %v", res.rank, res.err)
		}
	}
	if k := m.keepAlives.Load(); k != 0 {
		t.Errorf("%d keep-alives sent with the progress timeout off", k)
	}
}

// The deadline's clock: silence counts only while the rank waits, restarts on every message from
// rank 0 and after a gap that shows this process did not run. The driver looks every 100 ms.
func TestCoordClock(t *testing.T) {
	const limit = time.Second
	tests := []struct {
		name    string
		waiting func(ms int) bool
		heard   []int // when messages from rank 0 came
		frozen  [2]int
		expires int // the first look that finds the deadline passed; -1 for none until 5 s
	}{
		{"silence while waiting", func(int) bool { return true }, nil, [2]int{}, 1000},
		{"not waiting", func(int) bool { return false }, nil, [2]int{}, -1},
		{"the clock starts when waiting starts", func(ms int) bool { return ms >= 900 }, []int{0, 100}, [2]int{}, 1900},
		{"keep-alives", func(int) bool { return true }, []int{200, 400, 600, 800, 1000, 1200}, [2]int{}, 2200},
		{"this process did not run", func(int) bool { return true }, nil, [2]int{500, 3000}, 4000},
		{"answered, then waiting again", func(ms int) bool { return ms < 800 || ms >= 1000 }, []int{800}, [2]int{}, 2000},
	}
	t0 := time.Unix(1000, 0)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var c coordClock
			for ms := 0; ms <= 5000; ms += 100 {
				if ms > tc.frozen[0] && ms < tc.frozen[1] {
					continue
				}
				now := t0.Add(time.Duration(ms) * time.Millisecond)
				if slices.Contains(tc.heard, ms) {
					c.heard(now)
				}
				if c.expired(now, tc.waiting(ms), limit) {
					if ms != tc.expires {
						t.Errorf("expired at %d ms, want %d", ms, tc.expires)
					}
					return
				}
			}
			if tc.expires >= 0 {
				t.Errorf("not expired by 5 s, want at %d ms", tc.expires)
			}
		})
	}
}

// A rank that reads no control message (stopped) while the coordinator has responses for it: the
// coordinator's send to it used to wait for ever, holding every rank. It gives up after the
// progress timeout, and the ranks that can still run fail naming the stuck rank.
func TestCoordinatorSendToAStuckRankFailsNamingIt(t *testing.T) {
	const n, limit = 3, 300 * time.Millisecond
	captureLog(t)
	cfg := DefaultConfig()
	cfg.ProgressTimeout = limit
	stuck := &atomic.Bool{}
	stopped := &stoppableMessenger{done: make(chan struct{})}
	sent := make(chan int, 16)
	c := newClusterWith(t, n, cfg, []inmem.Option{inmem.WithProgressTimeout(limit)}, func(r int, ep *inmem.Endpoint, g *Group) {
		switch r {
		case 0:
			g.Messenger = unreadMessenger{g.Messenger, 1, stuck}
		case 1:
			spy(g, sent)
			stopped.Messenger = g.Messenger
			g.Messenger = stopped
		}
	})
	t.Cleanup(func() {
		stuck.Store(false)
		stopped.Cont()
		c.eps[1].Resume()
		close(stopped.done)
	})
	warmUp(t, c)
	for len(sent) > 0 {
		<-sent
	}
	stuck.Store(true)
	start := time.Now()
	results := allreduceOn(waitCtx(t), c, "grad.w", 0, 1, 2)
	select { // rank 1 submitted: now it stops, before the responses come
	case <-sent:
	case <-time.After(5 * time.Second):
		t.Fatal("rank 1 did not submit")
	}
	stopped.Stop()
	c.eps[1].Pause()
	for got := 0; got < n-1; {
		select {
		case res := <-results:
			if res.rank == 1 {
				// Only rank 1's control lane is stopped here: its engine runs on, and its own
				// deadline on the coordinator fires. A stopped process would not return.
				continue
			}
			got++
			if res.err == nil || !strings.Contains(res.err.Error(), "rank 1 (memhost) made no progress for 300ms") {
				t.Errorf("rank %d: err = %v, want one naming rank 1", res.rank, res.err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("ranks still wait %v after rank 1 stopped", time.Since(start))
		}
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("the ranks failed after %v, want about the 300ms timeout", took)
	}
}
