package launch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kolo-dl/kolo/internal/launch/elastic"
	"github.com/kolo-dl/kolo/internal/launch/layout"
	"github.com/kolo-dl/kolo/internal/launch/proc"
)

// The joining side of a no-ssh job, static or elastic (node.go): it reads its orders in order with
// blocking Gets, as workers read rounds, and prefixes its workers' output with their rank (static)
// or place (elastic). It ends at the serving node's end order, printing what it says and exiting
// with the job's code; when its own kolo run is interrupted, it leaves the job (an elastic job goes
// on, a static one stops); when the rendezvous is gone, the job has ended with the serving node.

// reportTimeout bounds each write of a joined node to the rendezvous.
const reportTimeout = 5 * time.Second

// joinJob registers this node, waits (--start-timeout) for the serving node's welcome and runs
// the node's part of the job.
func joinJob(ctx context.Context, n *node, set elasticSettings) (int, error) {
	o, rv := n.opts, n.rv
	ip := ""
	if ta, ok := rv.LocalAddr().(*net.TCPAddr); ok {
		ip = ta.IP.String()
	}
	jctx, cancel := context.WithTimeout(ctx, o.StartTimeout)
	defer cancel()
	join := NodeJoin{Hostname: n.host, Slots: n.slots, Addr: ip, NodeRank: -1}
	if o.Elastic() {
		join.Flags = o.ElasticNodeFlags()
	} else {
		join.Static, join.NNodes, join.NP, join.NodeRank = true, o.NNodes, o.NP, o.NodeRank
	}
	num, err := rv.Add(jctx, NodesKey, 1)
	if err == nil {
		err = rv.Set(jctx, NodeKey(int(num)), join.Encode())
	}
	if err != nil {
		return 1, fmt.Errorf("join the job at %s: %w", o.Rendezvous, err)
	}
	v, err := rv.Get(jctx, NodeWelcomeKey(int(num)))
	if err != nil {
		if ctx.Err() != nil {
			// The welcome may still come: then the node is in the job, and leaves at once.
			n.tell(NodeLeftKey(int(num)), []byte("its kolo run was interrupted before it was welcomed"), time.Second)
			return ExitInterrupted, errors.New("interrupted while waiting for the serving node's welcome")
		}
		return 1, fmt.Errorf("waited up to %s (--start-timeout) at %s for the serving node to welcome this node (node %d): %w", o.StartTimeout, o.Rendezvous, num, err)
	}
	w, err := DecodeNodeWelcome(v)
	if err != nil {
		return 1, fmt.Errorf("the serving node's welcome: %w", err)
	}
	if w.Refused != "" {
		// Read: the serving node, which may be ending because of this node, need not wait for it.
		n.tell(NodeDoneKey(int(num)), []byte("refused"), time.Second)
		return ExitUsage, fmt.Errorf("the serving node at %s refused this node: %s", o.Rendezvous, w.Refused)
	}
	if o.MetricsAddr != "" {
		fmt.Fprintln(n.stderr, "kolo run: --metrics-addr: the node that serves the rendezvous serves the metrics")
	}
	starter, closeGuard := set.localStarter(o, n.bind)
	defer closeGuard()
	a := &elasticAgent{
		n: n, set: set, num: int(num), welcome: w, extra: workerExtraEnv(o),
		out:   proc.NewLineWriter(n.stdout, o.Timestamps),
		errw:  proc.NewLineWriter(n.stderr, o.Timestamps),
		procs: map[int]*elasticProc{},
		exits: make(chan elasticExit),
	}
	a.sup = workerSupervisor(o, set, starter, a.out, a.errw, a.log)
	a.log("joined the job at %s as host %s (node %d, %s)", o.Rendezvous, w.Host, num, countOf(n.slots, "slot"))
	return a.run(ctx)
}

// tell sets key to v at the rendezvous, waiting up to d.
func (n *node) tell(key string, v []byte, d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return n.rv.Set(ctx, key, v)
}

// elasticAgent is a joined node's state; only run's goroutine touches it.
type elasticAgent struct {
	n       *node
	set     elasticSettings
	num     int
	welcome NodeWelcome
	sup     *proc.Supervisor
	extra   map[string]string

	out, errw *proc.LineWriter
	procs     map[int]*elasticProc // by worker number (the order that started it), until it exits
	exits     chan elasticExit
	reported  int // exit records written
}

// errRendezvousLost wraps why a joined node lost the rendezvous.
var errRendezvousLost = errors.New("lost the rendezvous")

func (a *elasticAgent) run(ctx context.Context) (int, error) {
	bg, stop := context.WithCancel(context.Background())
	defer func() {
		stop()
		a.sup.Close()
	}()
	orders := make(chan NodeOrder)
	lost := make(chan error, 2)
	go a.readOrders(bg, orders, lost)
	go func() {
		// Tells the serving node this node is alive, and notices when the serving node is not.
		if err := sendBeats(bg, a.n.rv, NodeBeatKey(a.num), a.set.beat, a.set.nodeSilence); err != nil {
			lost <- err
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return a.leave()
		case err := <-lost:
			return a.lost(err)
		case o := <-orders:
			switch o.Kind {
			case OrderStart:
				if err := a.start(o); err != nil {
					return a.lost(err)
				}
			case OrderStop:
				if p := a.procs[o.Worker]; p != nil {
					p.stopped = true
					p.child.Signal(syscall.Signal(o.Signal))
				}
			case OrderEnd:
				return a.end(o)
			}
		case x := <-a.exits:
			if err := a.report(x, false); err != nil {
				return a.lost(err)
			}
		}
	}
}

// readOrders reads this node's orders in order, each with a blocking Get: an order may come
// hours after the last. The heartbeat bounds the wait: when the serving node stops answering,
// it ends the node and with it this Get.
func (a *elasticAgent) readOrders(ctx context.Context, out chan<- NodeOrder, lost chan<- error) {
	for k := 1; ; k++ {
		v, err := a.n.rv.Get(ctx, NodeOrderKey(a.num, k))
		if ctx.Err() != nil {
			return
		}
		var o NodeOrder
		if err == nil {
			o, err = DecodeNodeOrder(v)
		}
		if err != nil {
			lost <- fmt.Errorf("reading order %d: %w", k, err)
			return
		}
		select {
		case out <- o:
		case <-ctx.Done():
			return
		}
		if o.Kind == OrderEnd {
			return
		}
	}
}

// start starts the worker an order asks for. A worker that cannot be started is reported as an
// exit.
func (a *elasticAgent) start(o NodeOrder) error {
	opts, w := a.n.opts, a.welcome
	s := layout.Slot{Rank: o.Rank, Size: o.Size, Host: w.Host, LocalRank: o.LocalRank, LocalSize: o.LocalSize,
		CrossRank: o.CrossRank, CrossSize: o.CrossSize}
	p := &elasticProc{place: elastic.Worker{Host: w.Host, Slot: o.Slot}, round: o.Round, rank: o.Rank, num: o.Worker}
	// A static job's workers get the static contract, and their output is known by rank, as
	// that of a job started from one machine.
	env := WorkerEnv(s, opts.Rendezvous, w.JobID, string(a.n.secret), a.extra, opts.Env)
	label, dir := strconv.Itoa(o.Rank), fmt.Sprintf("rank.%d", o.Rank)
	if !w.Static {
		env = elasticWorkerEnv(s, o.Slot, o.Round, w.Timeout, opts.Rendezvous, w.JobID, string(a.n.secret), a.extra, opts.Env)
		label, dir = p.place.String(), p.place.String()
	}
	child, err := a.sup.Start(context.Background(), proc.Worker{Slot: s, Argv: opts.Command, Env: env}, label, dir, func(e proc.Exit) {
		a.exits <- elasticExit{p, e} // run drains exits until every worker has ended
	})
	p.child = child
	if err != nil {
		a.log("%s could not be started: %v", p.place, err)
		return a.report(elasticExit{p, proc.Exit{Code: -1, Err: fmt.Errorf("start %s: %w", p.place, err)}}, false)
	}
	a.procs[o.Worker] = p
	if opts.Verbose {
		a.log("started %s for round %d as rank %d", p.place, p.round, p.rank)
	}
	return nil
}

// report tells the serving node that a worker ended, with the last lines of its stderr when it
// failed.
func (a *elasticAgent) report(x elasticExit, leaving bool) error {
	p := x.p
	p.exited, p.exit = true, x.exit
	delete(a.procs, p.num)
	rec := NodeExit{Worker: p.num, Code: x.exit.Code, Signal: int(x.exit.Signal), Leaving: leaving}
	if x.exit.Err != nil {
		rec.Err = x.exit.Err.Error()
	}
	if x.exit.Failed() {
		rec.Tail = p.child.Tail(time.Second)
		if !leaving && !p.stopped {
			a.log("%s %s", p, x.exit)
		}
	}
	a.reported++
	if err := a.n.tell(NodeExitKey(a.num, a.reported), rec.Encode(), reportTimeout); err != nil {
		return fmt.Errorf("report how %s ended: %w", p.place, err)
	}
	return nil
}

// end is the serving node's end of the job: every node exits with its code.
func (a *elasticAgent) end(o NodeOrder) (int, error) {
	a.stopAll(false) // none runs unless the end came from a node dropped as lost
	if o.Reason != "" {
		a.errw.WriteBlock(strings.TrimSuffix(o.Reason, "\n") + "\n")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if b, ok, err := a.n.rv.TryGet(ctx, NodeOutcomeKey); ok && err == nil { // set before the end order
		var whole Outcome
		if json.Unmarshal(b, &whole) == nil {
			a.n.outcome = &whole
		}
	}
	a.n.rv.Set(ctx, NodeDoneKey(a.num), []byte("1"))
	return o.Code, nil
}

// leave takes this node out of the job when its kolo run is interrupted: the serving node first
// learns that the node leaves, so that its workers' ends are no failures, then they are stopped.
func (a *elasticAgent) leave() (int, error) {
	err := a.n.tell(NodeLeftKey(a.num), []byte("its kolo run was interrupted"), reportTimeout)
	a.stopAll(err == nil)
	if a.welcome.Static {
		return ExitInterrupted, fmt.Errorf("interrupted: this node (host %s) left the job and stopped its ranks; the job stops on every node", a.welcome.Host)
	}
	return ExitInterrupted, fmt.Errorf("interrupted: this node (host %s) left the elastic job and stopped its workers; the job goes on without them", a.welcome.Host)
}

// lost ends the node when the rendezvous, which lives on the serving node, is gone.
func (a *elasticAgent) lost(err error) (int, error) {
	a.stopAll(false)
	return 1, fmt.Errorf("%w at %s (%v): the job ended with the serving node, which holds the rendezvous and runs the job; stopped this node's workers",
		errRendezvousLost, a.n.opts.Rendezvous, err)
}

// stopAll stops every running worker (the supervisor kills it stopGrace later) and waits for
// their exits, reporting them (as the exits of a node that leaves) when report is set.
func (a *elasticAgent) stopAll(report bool) {
	for _, p := range a.procs {
		p.stopped = true
		p.child.Stop(proc.StopSignal)
	}
	for len(a.procs) > 0 {
		x := <-a.exits
		if report {
			if err := a.report(x, true); err != nil {
				report = false
			}
		} else {
			x.p.exited = true
			delete(a.procs, x.p.num)
		}
	}
}

// log writes a "kolo run: elastic:" line to stderr, between the workers' lines. A node of a
// static job says what it does only with --verbose: its failures are in the job's summary.
func (a *elasticAgent) log(format string, args ...any) {
	switch {
	case !a.welcome.Static:
		a.errw.WriteLine("", "kolo run: elastic: "+fmt.Sprintf(format, args...)+"\n")
	case a.n.opts.Verbose:
		a.errw.WriteLine("", "kolo run: "+fmt.Sprintf(format, args...)+"\n")
	}
}
