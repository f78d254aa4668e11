package launch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kolo-dl/kolo/internal/jobenv"
	"github.com/kolo-dl/kolo/internal/launch/elastic"
	"github.com/kolo-dl/kolo/internal/launch/proc"
	"github.com/kolo-dl/kolo/internal/rendezvous"
)

// nodeRegistry is the serving node's registry of the nodes of a no-ssh job. Its poller reads,
// every tick, what the nodes wrote at the rendezvous (registrations, exits, heartbeats,
// departures), welcomes or refuses newcomers and hands the job the hosts available; the job
// starts and signals other nodes' workers through it (Start, remoteWorker). It never
// waits for the job, and the job never waits for it: a listing waits in newest, an exit in
// the worker's channel.
type nodeRegistry struct {
	st           *rendezvous.Server
	set          elasticSettings
	self         string       // the serving node's host
	local        proc.Starter // starts the serving node's own workers
	welcome      NodeWelcome  // every welcome, but for the host: the job id, and the elastic timeout or Static
	nnodes       int          // nodes the first listing waits for
	startTimeout time.Duration
	startBy      time.Time // when the first listing stops waiting for them
	log          func(format string, args ...any)
	// admit says why a node registering now is refused ("" when it is welcome): its flags differ
	// from this node's, it claims a node rank another node holds, ... Called with mu held.
	admit func(NodeJoin) string
	// left, when set, is told that a node left the job, before its workers are lost (a static
	// job stops). Called with mu held.
	left func(nd *jobNode, how departure, why string)

	mu      sync.Mutex
	nodes   []*jobNode // in order of joining; nodes[0] is the serving node
	byHost  map[string]*jobNode
	handled map[int]bool   // node numbers whose registration has been answered
	refused []int          // node numbers refused: the end waits for them to read why, as for the others
	listed  bool           // the first listing is out
	newest  chan discovery // capacity 1: the newest listing the job has not taken
	hurried bool           // a node silent for set.stoppingSilence is gone (hurry)
}

// departure is how a node left the job.
type departure int

const (
	nodeLeft   departure = iota + 1 // its kolo run was stopped, and it said so
	nodeSilent                      // it stopped heartbeating
)

// jobNode is a node of the job, as the serving node sees it.
type jobNode struct {
	num  int      // its number at the rendezvous (NodeKey); 0: the serving node
	host string   // the host its workers are in
	join NodeJoin // what it registered: its slots, the address it reaches the rendezvous from
	gone string   // why it left the job; "" while in it

	orders, exits int // orders published, exit records read
	beat          beatWatch
	workers       map[int]*remoteWorker // running, by number
}

func (e *nodeRegistry) add(nd *jobNode, now time.Time) {
	nd.beat = beatWatch{at: now}
	nd.workers = map[int]*remoteWorker{}
	e.nodes = append(e.nodes, nd)
	e.byHost[nd.host] = nd
}

// uniqueHost is the host name a newcomer's workers get: its own, or NAME-nodeK (K = 2, 3, ...:
// the first free) while a node in the job has that name, so that two nodes of one machine are
// two hosts. A node back on a machine it left gets the name it had, and the planner's blacklist
// with it.
func (e *nodeRegistry) uniqueHost(name string) string {
	if nd := e.byHost[name]; nd == nil || nd.gone != "" {
		return name
	}
	for k := 2; ; k++ {
		c := fmt.Sprintf("%s-node%d", name, k)
		if nd := e.byHost[c]; nd == nil || nd.gone != "" {
			return c
		}
	}
}

// addrs are the addresses the other nodes in the job reach the rendezvous from.
func (e *nodeRegistry) addrs() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for _, nd := range e.nodes[1:] {
		if nd.gone == "" && nd.join.Addr != "" {
			out = append(out, nd.join.Addr)
		}
	}
	return out
}

// listings is the loop's hostSource: it hands over each listing the poller made.
func (e *nodeRegistry) listings(ctx context.Context, out chan<- discovery) {
	for {
		select {
		case <-ctx.Done():
			return
		case d := <-e.newest:
			select {
			case out <- d:
			case <-ctx.Done():
				return
			}
		}
	}
}

// polling reads the nodes' records every tick, from when start is closed (nil: now), until the
// stop it returns, which waits for it to end.
func (e *nodeRegistry) polling(start <-chan struct{}) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		if start != nil {
			select {
			case <-start:
			case <-ctx.Done():
				return
			}
		}
		t := time.NewTicker(e.set.tick)
		defer t.Stop()
		for now := time.Now(); ctx.Err() == nil; {
			e.pollOnce(now)
			select {
			case <-ctx.Done():
			case now = <-t.C:
			}
		}
	}()
	return func() {
		cancel()
		<-polled
	}
}

func (e *nodeRegistry) pollOnce(now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	changed := e.readJoins(now)
	for _, nd := range e.nodes[1:] {
		if nd.gone == "" && e.readNode(nd, now) {
			changed = true
		}
	}
	var d *discovery
	switch {
	case !e.listed && len(e.hosts()) >= e.nnodes:
		e.listed = true
		d = &discovery{at: now, hosts: e.hosts()}
	case !e.listed && now.After(e.startBy):
		e.listed = true
		d = &discovery{at: now, err: e.arrivalError()}
	case e.listed && changed:
		d = &discovery{at: now, hosts: e.hosts()}
	}
	if d != nil {
		select {
		case <-e.newest: // replaced: only the poller sends
		default:
		}
		e.newest <- *d
	}
}

// readJoins answers the registrations not answered yet; it reports whether a node joined.
func (e *nodeRegistry) readJoins(now time.Time) bool {
	v, _, _ := e.st.TryGet(NodesKey)
	count, _ := strconv.Atoi(string(v))
	joined := false
	for num := 1; num <= count; num++ {
		if e.handled[num] {
			continue
		}
		b, ok, _ := e.st.TryGet(NodeKey(num))
		if !ok {
			continue // it has its number, not yet its record
		}
		e.handled[num] = true
		join, err := DecodeNodeJoin(b)
		var w NodeWelcome
		if err != nil {
			w.Refused = err.Error()
		} else {
			w.Refused = e.admit(join)
		}
		if w.Refused != "" {
			e.log("node %d refused: %s", num, w.Refused)
			e.refused = append(e.refused, num)
		} else {
			nd := &jobNode{num: num, host: e.uniqueHost(join.Hostname), join: join}
			e.add(nd, now)
			w = e.welcome
			w.Host = nd.host
			e.log("node %d joined from %s: host %s with %s", num, orDash(join.Addr), nd.host, countOf(join.Slots, "slot"))
			joined = true
		}
		e.st.Set(NodeWelcomeKey(num), w.Encode())
	}
	return joined
}

// readNode reads what node nd wrote since the last tick: a departure, its workers' exits, its
// heartbeat. It reports whether the node left.
func (e *nodeRegistry) readNode(nd *jobNode, now time.Time) bool {
	if v, ok, _ := e.st.TryGet(NodeLeftKey(nd.num)); ok {
		e.leave(nd, nodeLeft, "it left: "+string(v))
		return true
	}
	for {
		b, ok, _ := e.st.TryGet(NodeExitKey(nd.num, nd.exits+1))
		if !ok {
			break
		}
		nd.exits++
		x, err := DecodeNodeExit(b)
		if err != nil {
			e.log("node %d (host %s): unreadable exit record %d: %v", nd.num, nd.host, nd.exits, err)
			continue
		}
		if x.Leaving {
			e.leave(nd, nodeLeft, "it is leaving")
			return true
		}
		if w := nd.workers[x.Worker]; w != nil {
			exit := proc.Exit{Code: x.Code, Signal: syscall.Signal(x.Signal)}
			if x.Err != "" {
				exit.Err = errors.New(x.Err)
			}
			w.tail = x.Tail
			w.finish(exit)
		}
	}
	v, _, _ := e.st.TryGet(NodeBeatKey(nd.num))
	limit := e.set.nodeSilence
	if e.hurried {
		limit = min(limit, e.set.stoppingSilence)
	}
	if silent := nd.beat.silent(v, now); silent >= limit {
		why := fmt.Sprintf("no heartbeat for %.1f s", silent.Seconds())
		e.leave(nd, nodeSilent, why)
		// Alive but cut off or stopped, it learns that it is out when it reads again.
		prefix := "kolo run: elastic: "
		if e.welcome.Static {
			prefix = "kolo run: "
		}
		e.orderLocked(nd, NodeOrder{Kind: OrderEnd, Code: 1,
			Reason: fmt.Sprintf("%sthe serving node dropped this node (host %s) from the job: %s", prefix, nd.host, why)})
		return true
	}
	return false
}

// hurry shortens the silence after which a node is gone to set.stoppingSilence: the job is stopping,
// and a live node keeps beating while its workers stop.
func (e *nodeRegistry) hurry() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.hurried = true
}

// errNodeLeft is wrapped by the exit of a worker whose node left the job, and by the error of a
// start on such a node: no failure of the worker, since the listing without its host follows.
var errNodeLeft = errors.New("its node left the job")

// leave takes node nd out of the job: its workers are lost.
func (e *nodeRegistry) leave(nd *jobNode, how departure, why string) {
	nd.gone = why
	e.log("node %d (host %s) left the job: %s", nd.num, nd.host, why)
	if e.left != nil {
		e.left(nd, how, why)
	}
	for _, num := range slices.Sorted(maps.Keys(nd.workers)) {
		nd.workers[num].finish(proc.Exit{Code: -1, Err: fmt.Errorf("%w (node %d, host %s: %s)", errNodeLeft, nd.num, nd.host, why)})
	}
}

// members lists the nodes in the job, in the order they joined.
func (e *nodeRegistry) members() []jobNode {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []jobNode
	for _, nd := range e.nodes {
		if nd.gone == "" {
			out = append(out, *nd)
		}
	}
	return out
}

// hosts lists the nodes in the job, in the order they joined.
func (e *nodeRegistry) hosts() []elastic.Host {
	var hs []elastic.Host
	for _, nd := range e.nodes {
		if nd.gone == "" {
			hs = append(hs, elastic.Host{Name: nd.host, Slots: nd.join.Slots})
		}
	}
	return hs
}

// arrivalError says, at --start-timeout, which nodes came.
func (e *nodeRegistry) arrivalError() error {
	var here []string
	for _, h := range e.hosts() {
		here = append(here, fmt.Sprintf("%s with %s", h.Name, countOf(h.Slots, "slot")))
	}
	return fmt.Errorf("waited %s (--start-timeout) for %d nodes (--nnodes): %d joined (%s)",
		e.startTimeout, e.nnodes, len(here), strings.Join(here, ", "))
}

// orderLocked publishes the next order for node nd and returns its number.
func (e *nodeRegistry) orderLocked(nd *jobNode, o NodeOrder) (int, error) {
	nd.orders++
	if o.Kind == OrderStart {
		o.Worker = nd.orders
	}
	if err := e.st.Set(NodeOrderKey(nd.num, nd.orders), o.Encode()); err != nil {
		return 0, fmt.Errorf("order node %d (host %s): %w", nd.num, nd.host, err)
	}
	return nd.orders, nil
}

// Start starts the serving node's own workers itself (local) and orders the other nodes to start
// theirs. A worker of a static job (no elastic place in its environment) is at the slot of its
// local rank, and has no round.
func (e *nodeRegistry) Start(ctx context.Context, w proc.Worker) (proc.Process, error) {
	if w.Slot.Host == e.self {
		return e.local.Start(ctx, w)
	}
	place, round, ok, err := jobenv.ElasticPlace(jobenv.FromEnviron(w.Env))
	if err != nil {
		return nil, fmt.Errorf("worker of host %s has no place (%v)", w.Slot.Host, err)
	}
	if !ok {
		place, round = jobenv.Place{Host: w.Slot.Host, Slot: w.Slot.LocalRank}, 0
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	nd := e.byHost[w.Slot.Host]
	switch {
	case nd == nil:
		return nil, fmt.Errorf("no node is host %s", w.Slot.Host)
	case nd.gone != "":
		return nil, fmt.Errorf("%w (node %d, host %s: %s)", errNodeLeft, nd.num, nd.host, nd.gone)
	}
	s := w.Slot
	num, err := e.orderLocked(nd, NodeOrder{Kind: OrderStart, Slot: place.Slot, Round: round,
		Rank: s.Rank, Size: s.Size, LocalRank: s.LocalRank, LocalSize: s.LocalSize, CrossRank: s.CrossRank, CrossSize: s.CrossSize})
	if err != nil {
		return nil, err
	}
	rw := &remoteWorker{nodes: e, node: nd, num: num, exitc: make(chan proc.Exit, 1)}
	nd.workers[num] = rw
	return rw, nil
}

// end tells every node in the job that it ended, with the exit code and what to print, and waits
// (the settings' finishWait at most) until they, and the nodes it refused, have read their answer:
// the rendezvous closes when this node exits.
func (e *nodeRegistry) end(code int, note string, outcome Outcome) {
	const maxNote = 256 << 10 // an order is at most a 1 MiB record (nodeproto.go)
	if len(note) > maxNote {
		note = note[:maxNote] + "\n[...]"
	}
	if b, err := json.Marshal(outcome); err == nil {
		// Before the end orders: a node reads it once it has read its end.
		e.st.Set(NodeOutcomeKey, b)
	}
	e.mu.Lock()
	var wait []int // the nodes told, then those refused
	for _, nd := range e.nodes[1:] {
		if nd.gone != "" {
			continue
		}
		if _, err := e.orderLocked(nd, NodeOrder{Kind: OrderEnd, Code: min(max(code, 0), 255), Reason: note}); err == nil {
			wait = append(wait, nd.num)
		}
	}
	wait = append(wait, e.refused...)
	e.mu.Unlock()
	deadline := time.Now().Add(e.set.finishWait)
	for _, num := range wait {
		for time.Now().Before(deadline) && !stored(e.st, NodeDoneKey(num)) && !stored(e.st, NodeLeftKey(num)) {
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// stored reports whether st holds key.
func stored(st *rendezvous.Server, key string) bool {
	_, ok, err := st.TryGet(key)
	return ok && err == nil
}

// remoteWorker is, on the serving node, a worker another node runs: its output is printed there,
// signals are orders, and its exit is what the node reports, or a loss when the node leaves.
type remoteWorker struct {
	nodes *nodeRegistry
	node  *jobNode
	num   int
	exitc chan proc.Exit

	// Guarded by nodes.mu.
	done bool
	tail []string
}

func (w *remoteWorker) Stdout() io.Reader { return strings.NewReader("") }
func (w *remoteWorker) Stderr() io.Reader { return strings.NewReader("") }
func (w *remoteWorker) Wait() proc.Exit   { return <-w.exitc }

func (w *remoteWorker) StderrTail() []string {
	w.nodes.mu.Lock()
	defer w.nodes.mu.Unlock()
	return w.tail
}

func (w *remoteWorker) Signal(sig syscall.Signal) error {
	w.nodes.mu.Lock()
	defer w.nodes.mu.Unlock()
	if w.done {
		return nil
	}
	_, err := w.nodes.orderLocked(w.node, NodeOrder{Kind: OrderStop, Worker: w.num, Signal: int(sig)})
	return err
}

// finish ends the worker once; nodes.mu is held.
func (w *remoteWorker) finish(e proc.Exit) {
	if w.done {
		return
	}
	w.done = true
	delete(w.node.workers, w.num)
	w.exitc <- e
}

// countOf is "1 slot", "2 slots".
func countOf(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
