package launch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kolo-dl/kolo/internal/netif"
	"github.com/kolo-dl/kolo/jobenv"
	"github.com/kolo-dl/kolo/launch/elastic"
	"github.com/kolo-dl/kolo/launch/flags"
	"github.com/kolo-dl/kolo/launch/proc"
	"github.com/kolo-dl/kolo/rendezvous"
)

// Elastic mode without ssh: every node runs `kolo run --rendezvous HOST:PORT` with the elastic
// flags (--min-np, --max-np, ...).
//
// The node that serves the rendezvous (as in RunNode) also runs the elastic event loop
// (elasticJob) and its planner; the hosts it plans with are the nodes in the job: itself, and
// every node that joined at the rendezvous and has not left. A node joining is a host becoming
// available, with its slots (--nproc-per-node, -H localhost:N); a node whose kolo run stops (it
// says so) or that stops heartbeating is a host leaving, and its workers are lost. The serving
// node starts its own workers itself; a worker of another node is an order published for that
// node (jobenv.NodeOrder), which starts it with the same environment contract, prints its output
// and reports its exit (jobenv.NodeExit); the loop takes that exit as it takes a local worker's.
// The job ends on the serving node, which sends every node the exit code and the summary. The
// rendezvous and the planner live on the serving node: when it dies, the job ends on every node.
// The joining side is elasticagent.go; the keys and records are jobenv/elastic.go's.

// runElasticNode runs this node's part of a no-ssh elastic job: it serves the rendezvous and
// plans, or it joins as a host.
func runElasticNode(ctx context.Context, opts *flags.Options, set elasticSettings, stdout, stderr io.Writer) (int, error) {
	set.fill()
	secret, err := NodeSecret(opts)
	if err != nil {
		return ExitUsage, err
	}
	slots, err := elasticNodeSlots(opts)
	if err != nil {
		return ExitUsage, err
	}
	n := &node{opts: opts, secret: secret, slots: slots, stdout: stdout, stderr: stderr,
		stopped: make(chan struct{}), lost: make(chan struct{})}
	defer n.close()
	cctx, cancel := context.WithTimeout(ctx, opts.StartTimeout)
	code, err := n.connect(cctx)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return ExitInterrupted, fmt.Errorf("interrupted while reaching the rendezvous: %w", err)
		}
		return code, err
	}
	if n.srv != nil {
		return serveElastic(ctx, n, set)
	}
	return joinElasticJob(ctx, n, set)
}

// serveElastic runs the job's event loop on the serving node, with the nodes as its hosts.
func serveElastic(ctx context.Context, n *node, set elasticSettings) (int, error) {
	o := n.opts
	planner, err := elastic.NewPlanner(o.ElasticConfig())
	if err != nil {
		return ExitUsage, err
	}
	hn, err := os.Hostname()
	if err != nil {
		return 1, fmt.Errorf("this node's host name: %w", err)
	}
	nodes := &elasticNodes{
		st: n.srv, set: set, flags: o.ElasticNodeFlags(), jobID: n.jobID, timeout: planner.Config().Timeout,
		nnodes: max(o.NNodes, 1), startTimeout: o.StartTimeout, startBy: time.Now().Add(o.StartTimeout),
		byHost: map[string]*elasticNode{}, changed: make(chan struct{}, 1),
	}
	nodes.add(&elasticNode{host: hn, slots: n.slots}, time.Now())
	local := set.starter
	if local == nil {
		guard := startGuard(o.AfterOrphans)
		defer guard.Close()
		local = proc.LocalStarter{Guard: guard}
	}
	j := newElasticJob(o, set, planner, n.srv, nodeStarter{local: local, nodes: nodes}, string(n.secret), n.jobID, n.stdout, n.stderr)
	rv, err := n.elasticLocalRendezvous(nodes)
	if err != nil {
		return ExitUsage, err
	}
	j.workerRendezvous = func(host string) string {
		addr := rv()
		h, _, _ := net.SplitHostPort(addr)
		at, err := n.lns.at(h)
		if err != nil {
			slog.Warn("the rendezvous cannot listen where this node's workers dial it", "addr", addr, "err", err)
			return addr
		}
		return at
	}
	nodes.log = j.log
	j.log("serving the rendezvous at %s: host %s (%s); the first round waits for %s (--nnodes)", o.Rendezvous, hn, countOf(n.slots, "slot"), countOf(nodes.nnodes, "node"))

	pctx, stopPolling := context.WithCancel(context.Background())
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		select {
		case <-j.started:
		case <-pctx.Done():
			return
		}
		nodes.poll(pctx)
	}()
	code, err := j.run(ctx, nodes.listings)
	stopPolling()
	<-polled
	note := j.endNote
	switch {
	case note == "" && err != nil:
		note = "kolo run: elastic: " + err.Error()
	case note == "" && code == 0:
		note = fmt.Sprintf("kolo run: elastic: the job is done: every worker of round %d exited 0", j.round.Number)
	}
	nodes.end(code, note)
	return code, err
}

// elasticLocalRendezvous returns what gives the rendezvous address the serving node's own
// workers dial. A worker tells its peers the address it reaches the rendezvous from, so that
// must not be loopback once other machines' workers are in the job: --network-interface's
// address, else HOST of --rendezvous when it is not loopback here, else the address this machine
// reaches another node from (loopback while every node is this machine).
func (n *node) elasticLocalRendezvous(nodes *elasticNodes) (func() string, error) {
	o := n.opts
	if o.NetworkInterface != "" {
		ip, _, err := netif.InterfaceIP(o.NetworkInterface)
		if err != nil {
			return nil, fmt.Errorf("--network-interface: %w", err)
		}
		addr := net.JoinHostPort(ip.String(), n.port)
		return func() string { return addr }, nil
	}
	host, _, _ := net.SplitHostPort(o.Rendezvous)
	if ips, err := net.LookupIP(host); err == nil && len(ips) > 0 && !ips[0].IsLoopback() {
		return func() string { return o.Rendezvous }, nil
	}
	return func() string {
		for _, addr := range nodes.addrs() {
			if ip, err := netif.SourceIP(addr); err == nil && !ip.IsLoopback() {
				return net.JoinHostPort(ip.String(), n.port)
			}
		}
		return net.JoinHostPort("127.0.0.1", n.port)
	}, nil
}

// elasticNodes is the serving node's registry of the nodes of a no-ssh elastic job. Its poller
// reads, every tick, what the nodes wrote at the rendezvous (registrations, exits, heartbeats,
// departures), welcomes or refuses newcomers and hands the loop the hosts available; the loop
// starts and signals other nodes' workers through it (nodeStarter, remoteWorker). It never
// waits for the loop, and the loop never waits for it: a listing waits in pending, an exit in
// the worker's channel.
type elasticNodes struct {
	st           *rendezvous.Server
	set          elasticSettings
	flags        string // Options.ElasticNodeFlags: a node with others is refused
	jobID        string
	timeout      time.Duration
	nnodes       int // nodes the first listing waits for
	startTimeout time.Duration
	startBy      time.Time // when the first listing stops waiting for them
	log          func(format string, args ...any)

	mu      sync.Mutex
	nodes   []*elasticNode // in order of joining; nodes[0] is the serving node
	byHost  map[string]*elasticNode
	handled map[int]bool // node numbers whose registration has been answered
	listed  bool         // the first listing is out
	pending *discovery   // the newest listing the loop has not taken
	changed chan struct{}
}

// elasticNode is a node of the job, as the serving node sees it.
type elasticNode struct {
	num   int    // its number at the rendezvous (jobenv.NodeKey); 0: the serving node
	host  string // the host its workers are in rounds
	slots int
	addr  string // the address it reaches the rendezvous from
	gone  string // why it left the job; "" while in it

	orders, exits int // orders published, exit records read
	beat          beatWatch
	workers       map[int]*remoteWorker // running, by number
}

func (e *elasticNodes) add(nd *elasticNode, now time.Time) {
	nd.beat = newBeatWatch(now)
	nd.workers = map[int]*remoteWorker{}
	e.nodes = append(e.nodes, nd)
	e.byHost[nd.host] = nd
}

// uniqueHost is the host name a newcomer's workers get: its own, or NAME-nodeK (K = 2, 3, ...:
// the first free) while a node in the job has that name, so that two nodes of one machine are
// two hosts. A node back on a machine it left gets the name it had, and the planner's blacklist
// with it.
func (e *elasticNodes) uniqueHost(name string) string {
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

// self is the serving node's host.
func (e *elasticNodes) self() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.nodes[0].host
}

// addrs are the addresses the other nodes in the job reach the rendezvous from.
func (e *elasticNodes) addrs() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for _, nd := range e.nodes[1:] {
		if nd.gone == "" && nd.addr != "" {
			out = append(out, nd.addr)
		}
	}
	return out
}

// listings is the loop's hostSource: it hands over each listing the poller made.
func (e *elasticNodes) listings(ctx context.Context, out chan<- discovery) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-e.changed:
		}
		e.mu.Lock()
		d := e.pending
		e.pending = nil
		e.mu.Unlock()
		if d == nil {
			continue
		}
		select {
		case out <- *d:
		case <-ctx.Done():
			return
		}
	}
}

// poll reads the nodes' records every tick until ctx ends.
func (e *elasticNodes) poll(ctx context.Context) {
	t := time.NewTicker(e.set.tick)
	defer t.Stop()
	e.pollOnce(time.Now())
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			e.pollOnce(now)
		}
	}
}

func (e *elasticNodes) pollOnce(now time.Time) {
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
	case !e.listed && e.live() >= e.nnodes:
		e.listed = true
		d = &discovery{at: now, hosts: e.hosts()}
	case !e.listed && now.After(e.startBy):
		e.listed = true
		d = &discovery{at: now, err: e.arrivalError()}
	case e.listed && changed:
		d = &discovery{at: now, hosts: e.hosts()}
	}
	if d != nil {
		e.pending = d
		select {
		case e.changed <- struct{}{}:
		default:
		}
	}
}

// readJoins answers the registrations not answered yet; it reports whether a node joined.
func (e *elasticNodes) readJoins(now time.Time) bool {
	v, _, _ := e.st.TryGet(jobenv.NodesKey)
	count, _ := strconv.Atoi(string(v))
	joined := false
	for num := 1; num <= count; num++ {
		if e.handled[num] {
			continue
		}
		b, ok, _ := e.st.TryGet(jobenv.NodeKey(num))
		if !ok {
			continue // it has its number, not yet its record
		}
		if e.handled == nil {
			e.handled = map[int]bool{}
		}
		e.handled[num] = true
		join, err := jobenv.DecodeNodeJoin(b)
		var w jobenv.NodeWelcome
		switch {
		case err != nil:
			w.Refused = err.Error()
		case join.Flags != e.flags:
			w.Refused = fmt.Sprintf("node on %s was started with %s, the serving node with %s: give every node the same elastic flags", join.Hostname, join.Flags, e.flags)
		default:
			nd := &elasticNode{num: num, host: e.uniqueHost(join.Hostname), slots: join.Slots, addr: join.Addr}
			e.add(nd, now)
			w = jobenv.NodeWelcome{Host: nd.host, JobID: e.jobID, Timeout: e.timeout}
			e.log("node %d joined from %s: host %s with %s", num, orDash(join.Addr), nd.host, countOf(nd.slots, "slot"))
			joined = true
		}
		if w.Refused != "" {
			e.log("node %d refused: %s", num, w.Refused)
		}
		e.st.Set(jobenv.NodeWelcomeKey(num), w.Encode())
	}
	return joined
}

// readNode reads what node nd wrote since the last tick: a departure, its workers' exits, its
// heartbeat. It reports whether the node left.
func (e *elasticNodes) readNode(nd *elasticNode, now time.Time) bool {
	if v, ok, _ := e.st.TryGet(jobenv.NodeLeftKey(nd.num)); ok {
		e.leave(nd, "it left: "+string(v))
		return true
	}
	for {
		b, ok, _ := e.st.TryGet(jobenv.NodeExitKey(nd.num, nd.exits+1))
		if !ok {
			break
		}
		nd.exits++
		x, err := jobenv.DecodeNodeExit(b)
		if err != nil {
			e.log("node %d (host %s): unreadable exit record %d: %v", nd.num, nd.host, nd.exits, err)
			continue
		}
		if x.Leaving {
			e.leave(nd, "it is leaving")
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
	v, _, _ := e.st.TryGet(jobenv.NodeBeatKey(nd.num))
	if silent := nd.beat.silent(v, now); silent >= e.set.nodeSilence {
		why := fmt.Sprintf("no heartbeat for %.1f s", silent.Seconds())
		e.leave(nd, why)
		// Alive but cut off or stopped, it learns that it is out when it reads again.
		e.orderLocked(nd, jobenv.NodeOrder{Kind: jobenv.OrderEnd, Code: 1,
			Reason: fmt.Sprintf("kolo run: elastic: the serving node dropped this node (host %s) from the job: %s", nd.host, why)})
		return true
	}
	return false
}

// errNodeLeft is wrapped by the exit of a worker whose node left the job, and by the error of a
// start on such a node: no failure of the worker, since the listing without its host follows.
var errNodeLeft = errors.New("its node left the job")

// leave takes node nd out of the job: its workers are lost.
func (e *elasticNodes) leave(nd *elasticNode, why string) {
	nd.gone = why
	e.log("node %d (host %s) left the job: %s", nd.num, nd.host, why)
	for _, num := range sortedNums(nd.workers) {
		w := nd.workers[num]
		w.finish(proc.Exit{Code: -1, Err: fmt.Errorf("%w (node %d, host %s: %s)", errNodeLeft, nd.num, nd.host, why)})
	}
}

func (e *elasticNodes) live() int {
	n := 0
	for _, nd := range e.nodes {
		if nd.gone == "" {
			n++
		}
	}
	return n
}

// hosts lists the nodes in the job, in the order they joined.
func (e *elasticNodes) hosts() []elastic.Host {
	var hs []elastic.Host
	for _, nd := range e.nodes {
		if nd.gone == "" {
			hs = append(hs, elastic.Host{Name: nd.host, Slots: nd.slots})
		}
	}
	return hs
}

// arrivalError says, at --start-timeout, which nodes came.
func (e *elasticNodes) arrivalError() error {
	var here []string
	for _, nd := range e.nodes {
		if nd.gone == "" {
			here = append(here, fmt.Sprintf("%s with %s", nd.host, countOf(nd.slots, "slot")))
		}
	}
	return fmt.Errorf("waited %s (--start-timeout) for %d nodes (--nnodes): %d joined (%s)",
		e.startTimeout, e.nnodes, len(here), strings.Join(here, ", "))
}

// orderLocked publishes the next order for node nd and returns its number.
func (e *elasticNodes) orderLocked(nd *elasticNode, o jobenv.NodeOrder) (int, error) {
	nd.orders++
	if o.Kind == jobenv.OrderStart {
		o.Worker = nd.orders
	}
	if err := e.st.Set(jobenv.NodeOrderKey(nd.num, nd.orders), o.Encode()); err != nil {
		return 0, fmt.Errorf("order node %d (host %s): %w", nd.num, nd.host, err)
	}
	return nd.orders, nil
}

// start orders the worker w on its node.
func (e *elasticNodes) start(w proc.Worker) (proc.Process, error) {
	place, round, ok, err := jobenv.ElasticPlace(jobenv.FromEnviron(w.Env))
	if err != nil || !ok {
		return nil, fmt.Errorf("worker of host %s has no place (%v)", w.Slot.Host, err)
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
	num, err := e.orderLocked(nd, jobenv.NodeOrder{Kind: jobenv.OrderStart, Slot: place.Slot, Round: round,
		Rank: s.Rank, Size: s.Size, LocalRank: s.LocalRank, LocalSize: s.LocalSize, CrossRank: s.CrossRank, CrossSize: s.CrossSize})
	if err != nil {
		return nil, err
	}
	rw := &remoteWorker{nodes: e, node: nd, num: num, exitc: make(chan proc.Exit, 1)}
	nd.workers[num] = rw
	return rw, nil
}

// end tells every node in the job that it ended, with the exit code and what to print, and waits
// (finishWait at most) until they have read it: the rendezvous closes when this node exits.
func (e *elasticNodes) end(code int, note string) {
	const maxNote = 256 << 10 // an order is at most jobenv's 1 MiB record
	if len(note) > maxNote {
		note = note[:maxNote] + "\n[...]"
	}
	e.mu.Lock()
	var told []*elasticNode
	for _, nd := range e.nodes[1:] {
		if nd.gone != "" {
			continue
		}
		if _, err := e.orderLocked(nd, jobenv.NodeOrder{Kind: jobenv.OrderEnd, Code: min(max(code, 0), 255), Reason: note}); err == nil {
			told = append(told, nd)
		}
	}
	e.mu.Unlock()
	deadline := time.Now().Add(finishWait)
	for _, nd := range told {
		for time.Now().Before(deadline) {
			if _, ok, _ := e.st.TryGet(jobenv.NodeDoneKey(nd.num)); ok {
				break
			}
			if _, ok, _ := e.st.TryGet(jobenv.NodeLeftKey(nd.num)); ok {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// nodeStarter starts the serving node's own workers itself and orders the others' nodes to.
type nodeStarter struct {
	local proc.Starter
	nodes *elasticNodes
}

func (s nodeStarter) Start(ctx context.Context, w proc.Worker) (proc.Process, error) {
	if w.Slot.Host == s.nodes.self() {
		return s.local.Start(ctx, w)
	}
	return s.nodes.start(w)
}

// remoteWorker is, on the serving node, a worker another node runs: its output is printed there,
// signals are orders, and its exit is what the node reports, or a loss when the node leaves.
type remoteWorker struct {
	nodes *elasticNodes
	node  *elasticNode
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
	_, err := w.nodes.orderLocked(w.node, jobenv.NodeOrder{Kind: jobenv.OrderStop, Worker: w.num, Signal: int(sig)})
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

// sortedNums lists the keys of m in order.
func sortedNums[V any](m map[int]V) []int {
	ks := make([]int, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Ints(ks)
	return ks
}
