package launch

import (
	"context"
	"encoding/json"
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

	"github.com/kolo-dl/kolo/auth"
	"github.com/kolo-dl/kolo/internal/netif"
	"github.com/kolo-dl/kolo/jobenv"
	"github.com/kolo-dl/kolo/launch/flags"
	"github.com/kolo-dl/kolo/launch/layout"
	"github.com/kolo-dl/kolo/launch/proc"
	"github.com/kolo-dl/kolo/observe/relay"
	"github.com/kolo-dl/kolo/observe/report"
	"github.com/kolo-dl/kolo/rendezvous"
)

// No-ssh mode: every node of the job runs `kolo run --rendezvous HOST:PORT --nnodes N ...` itself
// (a container, a Kubernetes pod, a batch system's per-node step), the way torchrun does. The node
// that owns HOST serves the rendezvous; every node registers there, waits for the others, computes
// the same plan and starts its own ranks. A failure anywhere is published there and stops every
// node's ranks; at the end every node prints the same summary and exits with the same code.
//
// Keys the launchers use in the rendezvous store (workers use world/...):
//
//	launch/job            the job id, set by the serving node
//	launch/arrived        counter handing out node ranks in order of arrival
//	launch/claim/I        counter: more than 1 means two nodes claim node rank I
//	launch/node/I         node I's nodeInfo
//	launch/stopn          counter: the first node to stop the job sets launch/stop
//	launch/stop           why the job is being stopped (stopRecord)
//	launch/conflict       set by a node that found its node rank taken (conflictRecord)
//	launch/beat/I         node I's heartbeat counter, watched by the serving node
//	launch/done/I         how node I's ranks ended (doneRecord), written once (SetIfAbsent): by
//	                      node I, or by the serving node for a node it declared lost
//	launch/finished       counter of nodes that have read every done record
const (
	keyJob      = "launch/job"
	keyNodes    = "launch/node" // the nodes' registrations: a rendezvous Gather, node i's at keyNode(i)
	keyArrived  = "launch/arrived"
	keyConflict = "launch/conflict"
	keyStopN    = "launch/stopn"
	keyStop     = "launch/stop"
	keyFinished = "launch/finished"
)

func keyClaim(i int) string { return "launch/claim/" + strconv.Itoa(i) }
func keyNode(i int) string  { return keyNodes + "/" + strconv.Itoa(i) }
func keyBeat(i int) string  { return "launch/beat/" + strconv.Itoa(i) }
func keyDone(i int) string  { return "launch/done/" + strconv.Itoa(i) }

// Timings of the node protocol. Variables so that tests can shorten them.
var (
	beatInterval = time.Second
	// nodeSilence is how long the serving node waits for a node's heartbeat before declaring the
	// node lost and stopping the job.
	nodeSilence = 10 * time.Second
	// stoppingSilence replaces nodeSilence once the job is being stopped.
	stoppingSilence = 3 * time.Second
	// stoppedNodesWait bounds how long, once the job is being stopped, a node waits for the
	// others to report how their ranks ended (they need the grace period to stop them).
	stoppedNodesWait = 10 * time.Second
	// finishWait bounds how long the serving node keeps the rendezvous up for the others to read
	// the outcome after it has read it.
	finishWait = 5 * time.Second
)

// nodeInfo is what a node registers.
type nodeInfo struct {
	Index    int    `json:"index"`
	Hostname string `json:"hostname"`
	Slots    int    `json:"slots"`
	NP       int    `json:"np,omitempty"` // -np asked for on that node, 0 if none
	NNodes   int    `json:"nnodes"`
	IP       string `json:"ip"` // the address it reaches the rendezvous from
}

// rankRecord is one rank's Result in a form that crosses the wire.
type rankRecord struct {
	Slot    layout.Slot `json:"slot"`
	Code    int         `json:"code"`
	Signal  int         `json:"signal,omitempty"`
	Err     string      `json:"err,omitempty"`
	Stopped bool        `json:"stopped,omitempty"`
	Ended   int64       `json:"ended"` // unix nanoseconds: failures on different nodes are ordered by it
	Tail    []string    `json:"tail,omitempty"`
}

func recordOf(r proc.Result) rankRecord {
	rec := rankRecord{Slot: r.Slot, Code: r.Exit.Code, Signal: int(r.Exit.Signal), Stopped: r.Stopped, Tail: r.StderrTail}
	if r.Exit.Err != nil {
		rec.Err = r.Exit.Err.Error()
	}
	if !r.Ended.IsZero() {
		rec.Ended = r.Ended.UnixNano()
	}
	return rec
}

func (rec rankRecord) result() proc.Result {
	r := proc.Result{Slot: rec.Slot, Exit: proc.Exit{Code: rec.Code, Signal: syscall.Signal(rec.Signal)}, Stopped: rec.Stopped, StderrTail: rec.Tail}
	if rec.Err != "" {
		r.Exit.Err = errors.New(rec.Err)
	}
	if rec.Ended != 0 {
		r.Ended = time.Unix(0, rec.Ended)
	}
	return r
}

// Reasons a job is stopped.
const (
	stopFailed      = "failed"
	stopInterrupted = "interrupted"
	stopLost        = "lost"
	stopError       = "error" // a node could not start its ranks
)

// stopRecord says why the job is being stopped and by whom.
type stopRecord struct {
	Reason string      `json:"reason"`
	Node   int         `json:"node"`
	Host   string      `json:"host"`
	Rank   *rankRecord `json:"rank,omitempty"` // the failed rank, for stopFailed
	Detail string      `json:"detail,omitempty"`
}

// conflictRecord says that a second node claimed node rank Index; it is also the error the nodes
// still meeting fail with.
type conflictRecord struct {
	Index int    `json:"index"`
	Host  string `json:"host"` // the host of the node that came second
}

// nodeRankAdvice ends every node rank conflict error.
const nodeRankAdvice = "give --node-rank to every node, each its own, or to none"

func (c conflictRecord) Error() string {
	return fmt.Sprintf("node rank %d was claimed by two nodes (the second on %s): %s", c.Index, c.Host, nodeRankAdvice)
}

// doneRecord is how one node's ranks ended.
type doneRecord struct {
	Node   int          `json:"node"`
	Host   string       `json:"host"`
	Lost   string       `json:"lost,omitempty"` // set by the serving node for a node that went silent
	Ranks  []rankRecord `json:"ranks"`
	Failed bool         `json:"failed,omitempty"`
}

// NodeSecret is the secret every node of a no-ssh job shares, from where auth.JobSecret says:
// --secret-file, else KOLO_SECRET, else KOLO_SECRET_FILE, else HOROVOD_SECRET_KEY.
func NodeSecret(o *flags.Options) ([]byte, error) {
	secret, err := auth.JobSecret(o.SecretFile, jobenv.FromEnviron(os.Environ()))
	if err != nil {
		return nil, err
	}
	if secret == nil {
		return nil, fmt.Errorf("no job secret: with --rendezvous every node must share one; set %s (e.g. from a Kubernetes Secret) or --secret-file PATH", jobenv.Secret)
	}
	return secret, nil
}

// nodeSlots is how many ranks this node runs.
func nodeSlots(o *flags.Options) (int, error) {
	switch {
	case o.NprocPerNode > 0:
		return o.NprocPerNode, nil
	case o.Hosts != "":
		hosts, err := layout.ParseHosts(o.Hosts)
		if err != nil {
			return 0, err
		}
		if len(hosts) != 1 || !layout.IsLocal(hosts[0].Name) {
			return 0, fmt.Errorf("with --rendezvous each node starts only its own ranks: -H names this node only (-H localhost:N), got %q", o.Hosts)
		}
		return hosts[0].Slots, nil
	case o.NP > 0:
		if o.NP%o.NNodes != 0 {
			return 0, fmt.Errorf("-np %d does not split evenly over --nnodes %d: give each node --nproc-per-node", o.NP, o.NNodes)
		}
		return o.NP / o.NNodes, nil
	}
	return 0, errors.New("say how many ranks this node runs: --nproc-per-node N, -H localhost:N, or -np TOTAL (split evenly over --nnodes)")
}

// elasticNodeSlots is how many workers this node of a no-ssh elastic job runs: -np counts the
// job's ranks there, so it says nothing about a node's.
func elasticNodeSlots(o *flags.Options) (int, error) {
	if o.NprocPerNode == 0 && o.Hosts == "" {
		return 0, errors.New("say how many workers this node runs: --nproc-per-node N or -H localhost:N (in elastic mode -np, --min-np and --max-np count the job's ranks)")
	}
	return nodeSlots(o)
}

// RunNode runs this node's part of a no-ssh job (see the comment at the top of this file), or of
// an elastic one (elasticnode.go). It returns the job's exit code (the same on every node: 0, the
// first failing rank's, ExitInterrupted, ExitUsage, or 1) and an error to print, if any; the
// failure summary is already written to stderr.
func RunNode(ctx context.Context, opts *flags.Options, stdout, stderr io.Writer) (int, error) {
	if opts.Elastic() {
		return runElasticNode(ctx, opts, elasticSettings{}, stdout, stderr)
	}
	secret, err := NodeSecret(opts)
	if err != nil {
		return ExitUsage, err
	}
	slots, err := nodeSlots(opts)
	if err != nil {
		return ExitUsage, err
	}
	var bind *proc.Binding
	if opts.BindTo == flags.BindCore {
		if bind, err = proc.NewBinding(slots, opts.BindOverload); err != nil {
			return ExitUsage, err
		}
	}
	n := &node{opts: opts, secret: secret, slots: slots, bind: bind, stdout: stdout, stderr: stderr,
		stopped: make(chan struct{}), lost: make(chan struct{})}
	defer n.close()
	if code, err := n.meet(ctx); err != nil {
		n.abandon(err)
		if ctx.Err() != nil {
			return ExitInterrupted, fmt.Errorf("interrupted while the nodes met: %w", err)
		}
		return code, err
	}
	return n.run(ctx)
}

type node struct {
	opts           *flags.Options
	bind           *proc.Binding // --bind-to core: this node's ranks' CPUs; nil: no binding
	secret         []byte
	slots          int
	stdout, stderr io.Writer

	srv   *rendezvous.Server   // when this node serves the rendezvous
	lns   *rendezvousListeners // srv's
	rv    *rendezvous.Client
	port  string
	jobID string
	index int
	info  []byte // this node's registration (nodeInfo as JSON)
	infos []nodeInfo
	names []string // host name of each node in the plan (unique)

	claimed    bool // this node has claimed its node rank (launch/claim/I), won or not
	registered bool // this node's registration is in the store

	mu       sync.Mutex
	stop     *stopRecord   // first stop seen
	stopped  chan struct{} // closed when stop is set
	lostErr  error         // the rendezvous connection is gone
	lost     chan struct{} // closed when lostErr is set
	stopSent bool
}

func (n *node) close() {
	if n.rv != nil {
		n.rv.Close()
	}
	if n.srv != nil {
		if n.opts.Verbose {
			slog.Info("rendezvous served", "requests", n.srv.Requests(), "nodes", n.opts.NNodes)
		}
		n.srv.Close()
	}
}

// jobRecord is what the serving node publishes at keyJob.
type jobRecord struct {
	ID      string `json:"id"`
	Elastic bool   `json:"elastic,omitempty"` // an elastic job (elasticnode.go)
}

// meet serves or reaches the rendezvous, registers this node and waits (within --start-timeout)
// for the others.
func (n *node) meet(ctx context.Context) (int, error) {
	o := n.opts
	ctx, cancel := context.WithTimeout(ctx, o.StartTimeout)
	defer cancel()
	if code, err := n.connect(ctx); err != nil {
		return code, err
	}
	rv := n.rv
	if code, err := n.register(ctx); err != nil {
		return code, err
	}
	n.registered = true
	// A node that gives up while the others wait says why (see abandon).
	waitCtx, stopWaiting := context.WithCancelCause(ctx)
	defer stopWaiting(nil)
	go func() {
		v, err := rv.Get(waitCtx, keyStop)
		var rec stopRecord
		if err == nil && json.Unmarshal(v, &rec) == nil {
			stopWaiting(fmt.Errorf("node %d (%s) gave up: %s", rec.Node, rec.Host, rec.Detail))
		}
	}()
	go func() {
		// Two nodes with one node rank: the job cannot start (the one that came second says so).
		v, err := rv.Get(waitCtx, keyConflict)
		var rec conflictRecord
		if err == nil && json.Unmarshal(v, &rec) == nil {
			stopWaiting(rec)
		}
	}()
	// One request for every node's registration (the rendezvous answers once all have sent
	// theirs): start-up costs the server a request per node, not one per pair of nodes.
	vals, err := rv.Gather(waitCtx, keyNodes, o.NNodes, n.index, n.info)
	if err != nil {
		var conflict conflictRecord
		switch cause := context.Cause(waitCtx); {
		case errors.Is(err, rendezvous.ErrGatherMismatch):
			return ExitUsage, fmt.Errorf("the nodes disagree on --nnodes (this node has %d): %w", o.NNodes, err)
		case errors.As(cause, &conflict):
			return ExitUsage, cause
		case ctx.Err() != nil:
			return 1, n.arrivalError()
		case cause != nil && !errors.Is(cause, context.Canceled):
			return 1, cause
		}
		return 1, fmt.Errorf("waiting for the other nodes at %s (did a node give up?): %w", o.Rendezvous, err)
	}
	n.infos = make([]nodeInfo, o.NNodes)
	for i, v := range vals {
		if err := json.Unmarshal(v, &n.infos[i]); err != nil {
			return 1, fmt.Errorf("node %d's registration: %w", i, err)
		}
	}
	return n.checkInfos()
}

// connect serves the rendezvous when this node should (shouldServe), else reaches it, and reads
// the job id. A node whose job is elastic and the serving node's not (or the other way round)
// fails here, saying so.
func (n *node) connect(ctx context.Context) (int, error) {
	o := n.opts
	host, port, _ := net.SplitHostPort(o.Rendezvous)
	n.port = port
	dial := o.Rendezvous
	if n.shouldServe(host) {
		srv := rendezvous.NewServer(n.secret)
		lns := newRendezvousListeners(srv, port)
		bind, err := n.serveHost(host)
		if err != nil {
			return ExitUsage, err
		}
		at, err := lns.at(bind)
		switch {
		case err == nil:
			n.srv, n.lns = srv, lns
			if dial = at; bind == "" {
				dial = net.JoinHostPort("127.0.0.1", port)
			}
			rec, _ := json.Marshal(jobRecord{ID: NewJobID(), Elastic: o.Elastic()})
			srv.Set(keyJob, rec)
			if o.Verbose {
				slog.Info("serving the rendezvous", "port", port)
			}
		case errors.Is(err, syscall.EADDRINUSE):
			// Another node on this machine serves it (or a stranger holds the port: the
			// handshake below says so).
			if o.Verbose {
				slog.Info("rendezvous port in use here; joining as a client", "port", port)
			}
		default:
			return 1, fmt.Errorf("serve the rendezvous on port %s: %w", port, err)
		}
	}
	rv, err := rendezvous.Dial(ctx, dial, n.secret)
	if err != nil {
		return 1, fmt.Errorf("reach the rendezvous at %s: %w", o.Rendezvous, err)
	}
	n.rv = rv
	var job jobRecord
	v, err := rv.Get(ctx, keyJob)
	if err == nil {
		err = json.Unmarshal(v, &job)
	}
	if err != nil {
		return 1, fmt.Errorf("read the job id at %s: %w", o.Rendezvous, err)
	}
	n.jobID = job.ID
	switch {
	case job.Elastic && !o.Elastic():
		return ExitUsage, fmt.Errorf("the node serving the rendezvous at %s runs an elastic job: start every node with the same elastic flags (--min-np, --max-np)", o.Rendezvous)
	case !job.Elastic && o.Elastic():
		return ExitUsage, fmt.Errorf("the node serving the rendezvous at %s runs a job that is not elastic: start every node with the same flags (this one has --min-np or --max-np)", o.Rendezvous)
	}
	return 0, nil
}

// abandon, when this node fails before the job starts, tells the nodes still waiting why; the
// serving node keeps the rendezvous up for a moment so that they can read it.
func (n *node) abandon(err error) {
	if n.rv == nil || n.lostRendezvous() != nil {
		return
	}
	// A node-rank conflict is already told to every node (launch/conflict); a stop record as well
	// would let a late node report either one, with either exit code.
	var conflict conflictRecord
	if n.registered && !errors.As(err, &conflict) {
		hn, _ := os.Hostname()
		n.publishStop(stopRecord{Reason: stopError, Node: n.index, Host: hn, Detail: err.Error()})
	}
	if n.srv == nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		n.rv.Add(ctx, keyFinished, 1) // read and leaving: the serving node need not wait for us
		cancel()
		return
	}
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		// Every other node that has claimed a node rank is waiting, the one holding this node's
		// rank when this node came second (it may not have registered its details yet).
		waiting := 0
		for i := range n.opts.NNodes {
			v, _, _ := n.srv.TryGet(keyClaim(i))
			c, _ := strconv.Atoi(string(v))
			waiting += c
		}
		if n.claimed {
			waiting--
		}
		v, _, _ := n.srv.TryGet(keyFinished)
		if c, _ := strconv.Atoi(string(v)); c >= waiting {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// shouldServe: HOST is this machine, or this is node rank 0 and HOST does not resolve (yet: a
// Kubernetes service name before its endpoints exist).
func (n *node) shouldServe(host string) bool {
	if netif.IsThisMachine(host) {
		return true
	}
	if n.opts.NodeRank != 0 {
		return false
	}
	_, err := net.LookupHost(host)
	return err != nil
}

// serveHost is where this node, serving the rendezvous at host, listens: host when it is an
// address; for a name, the address of this machine it resolves to, --network-interface's address
// when it resolves to none but loopback (Debian maps a host's own name to 127.0.1.1, while the
// other nodes resolve it to an address of their network) or to nothing, else every interface.
// "localhost" is loopback: no other machine can dial it.
func (n *node) serveHost(host string) (string, error) {
	if ip := net.ParseIP(host); ip != nil {
		return host, nil
	}
	if host == "localhost" {
		return "127.0.0.1", nil
	}
	if ip, ok := netif.AddressHere(host); ok {
		return ip.String(), nil
	}
	if n.opts.NetworkInterface != "" {
		ip, _, err := netif.InterfaceIP(n.opts.NetworkInterface)
		if err != nil {
			return "", fmt.Errorf("--network-interface: %w", err)
		}
		return ip.String(), nil
	}
	return "", nil
}

func (n *node) register(ctx context.Context) (int, error) {
	o, rv := n.opts, n.rv
	if o.NodeRank >= 0 {
		n.index = o.NodeRank
	} else {
		a, err := rv.Add(ctx, keyArrived, 1)
		if err != nil {
			return 1, fmt.Errorf("register at %s: %w", o.Rendezvous, err)
		}
		if a > int64(o.NNodes) {
			return ExitUsage, fmt.Errorf("%d nodes have joined the rendezvous at %s already (--nnodes %d): is another job using it?", a-1, o.Rendezvous, o.NNodes)
		}
		n.index = int(a - 1)
	}
	c, err := rv.Add(ctx, keyClaim(n.index), 1)
	if err != nil {
		return 1, fmt.Errorf("register at %s: %w", o.Rendezvous, err)
	}
	n.claimed = true
	hn, err := os.Hostname()
	if err != nil {
		return 1, fmt.Errorf("this node's host name: %w", err)
	}
	if c > 1 {
		// Tell the nodes still meeting, so that they fail now, saying why, rather than wait out
		// --start-timeout for a node that will never come. A job already running never reads it.
		rec := conflictRecord{Index: n.index, Host: hn}
		b, _ := json.Marshal(rec)
		rv.SetIfAbsent(ctx, keyConflict, b) // the first conflict is the one reported
		return ExitUsage, fmt.Errorf("node rank %d is taken by another node: %s", n.index, nodeRankAdvice)
	}
	ip := ""
	if ta, ok := rv.LocalAddr().(*net.TCPAddr); ok {
		ip = ta.IP.String()
	}
	// Sent with the gather in meet, which stores it at keyNode(n.index).
	n.info, _ = json.Marshal(nodeInfo{Index: n.index, Hostname: hn, Slots: n.slots, NP: o.NP, NNodes: o.NNodes, IP: ip})
	if o.Verbose {
		slog.Info("registered", "node", n.index, "of", o.NNodes, "host", hn, "slots", n.slots)
	}
	return 0, nil
}

// arrivalError says, after --start-timeout, which nodes came and which did not.
func (n *node) arrivalError() error {
	o := n.opts
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var here, missing []string
	for i := range o.NNodes {
		v, ok, err := n.rv.TryGet(ctx, keyNode(i))
		var info nodeInfo
		if err == nil && ok && json.Unmarshal(v, &info) == nil {
			here = append(here, fmt.Sprintf("node %d on %s (%d ranks)", i, info.Hostname, info.Slots))
		} else {
			missing = append(missing, strconv.Itoa(i))
		}
	}
	if len(missing) == 0 {
		return fmt.Errorf("waited %s (--start-timeout) at %s: all %d nodes registered, but the rendezvous did not answer in time",
			o.StartTimeout, o.Rendezvous, o.NNodes)
	}
	return fmt.Errorf("waited %s (--start-timeout) at %s for %d nodes: %d arrived (%s); no sign of node %s",
		o.StartTimeout, o.Rendezvous, o.NNodes, len(here), strings.Join(here, ", "), strings.Join(missing, ", "))
}

// checkInfos checks that the nodes agree on the job and names each node's host uniquely.
func (n *node) checkInfos() (int, error) {
	me := n.infos[n.index]
	count := map[string]int{}
	for i, info := range n.infos {
		if info.NNodes != me.NNodes {
			return ExitUsage, fmt.Errorf("node %d on %s was started with --nnodes %d, this node with %d", i, info.Hostname, info.NNodes, me.NNodes)
		}
		if info.NP != 0 && me.NP != 0 && info.NP != me.NP {
			return ExitUsage, fmt.Errorf("node %d on %s was started with -np %d, this node with -np %d", i, info.Hostname, info.NP, me.NP)
		}
		count[info.Hostname]++
	}
	// Two containers can share a host name; each node must still be its own host in the plan.
	n.names = make([]string, len(n.infos))
	for i, info := range n.infos {
		n.names[i] = info.Hostname
		if count[info.Hostname] > 1 {
			n.names[i] = fmt.Sprintf("%s-node%d", info.Hostname, i)
		}
	}
	return 0, nil
}

// plan is the job's rank plan, the same on every node.
func (n *node) plan() ([]layout.Slot, error) {
	hosts := make([]layout.Host, len(n.infos))
	total, np := 0, 0
	for i, info := range n.infos {
		hosts[i] = layout.Host{Name: n.names[i], Slots: info.Slots}
		total += info.Slots
		if info.NP != 0 {
			np = info.NP
		}
	}
	if np == 0 {
		np = total
	}
	return layout.Plan(hosts, np)
}

// workerRendezvous is the address this node's workers dial. A worker advertises to its peers the
// address it reaches the rendezvous from, so on the serving node it must not be loopback when
// other nodes exist.
func (n *node) workerRendezvous() (string, error) {
	if n.srv == nil {
		return n.opts.Rendezvous, nil
	}
	addr, err := n.workerRendezvousAddr()
	if err != nil {
		return "", err
	}
	host, _, _ := net.SplitHostPort(addr)
	return n.lns.at(host)
}

// workerRendezvousAddr is workerRendezvous on the serving node, before it listens there.
func (n *node) workerRendezvousAddr() (string, error) {
	if n.opts.NetworkInterface != "" {
		ip, _, err := netif.InterfaceIP(n.opts.NetworkInterface)
		if err != nil {
			return "", fmt.Errorf("--network-interface: %w", err)
		}
		return net.JoinHostPort(ip.String(), n.port), nil
	}
	if len(n.infos) == 1 {
		return net.JoinHostPort("127.0.0.1", n.port), nil
	}
	host, _, _ := net.SplitHostPort(n.opts.Rendezvous)
	if ips, err := net.LookupIP(host); err == nil && len(ips) > 0 && !ips[0].IsLoopback() {
		return n.opts.Rendezvous, nil
	}
	// HOST is loopback here (Debian maps the host name to 127.0.1.1): use the address this machine
	// reaches another node from.
	for i, info := range n.infos {
		if i == n.index || info.IP == "" {
			continue
		}
		if ip, err := netif.SourceIP(info.IP); err == nil && !ip.IsLoopback() {
			return net.JoinHostPort(ip.String(), n.port), nil
		}
	}
	return n.opts.Rendezvous, nil
}

// run starts this node's ranks, stops them when any node stops the job, and reports the outcome.
func (n *node) run(ctx context.Context) (int, error) {
	myHost := n.names[n.index]
	slots, err := n.plan()
	if err == nil {
		var rvAddr string
		if rvAddr, err = n.workerRendezvous(); err == nil {
			return n.runRanks(ctx, slots, rvAddr)
		}
	}
	// The others have started their ranks: stop them too.
	n.publishStop(stopRecord{Reason: stopError, Node: n.index, Host: myHost, Detail: err.Error()})
	return ExitUsage, err
}

func (n *node) runRanks(ctx context.Context, slots []layout.Slot, rvAddr string) (int, error) {
	o := n.opts
	myHost := n.names[n.index]
	extra := workerExtraEnv(o)
	var workers []proc.Worker
	for _, s := range slots {
		if s.Host == myHost {
			workers = append(workers, proc.Worker{Slot: s, Argv: o.Command, Env: WorkerEnv(s, rvAddr, n.jobID, string(n.secret), extra, o.Env)})
		}
	}
	if o.Verbose {
		slog.Info("starting this node's ranks", "node", n.index, "host", myHost, "ranks", len(workers), "size", len(slots), "rendezvous", rvAddr)
	}

	runCtx, cancelRun := context.WithCancel(context.Background())
	defer cancelRun()
	bg, cancelBg := context.WithCancel(context.Background())
	var bgDone sync.WaitGroup
	defer func() {
		cancelBg()
		bgDone.Wait()
	}()
	bgDone.Add(3)
	go func() { defer bgDone.Done(); n.watchStop(bg, cancelRun) }()
	go func() { defer bgDone.Done(); n.heartbeat(bg) }()
	go func() {
		defer bgDone.Done()
		select {
		case <-ctx.Done():
			cancelRun()
			n.publishStop(stopRecord{Reason: stopInterrupted, Node: n.index, Host: myHost})
		case <-bg.Done():
		}
	}()
	if n.srv != nil {
		bgDone.Add(1)
		go func() { defer bgDone.Done(); n.watchNodes(bg, n.srv) }()
	}

	var store relay.Store = n.rv
	if n.srv != nil {
		store = relay.Local{S: n.srv.Store}
	}
	view, rankOut, rankErr, err := startLive(ctx, o, store, n.jobID, len(slots), n.srv != nil, n.stdout, n.stderr)
	if err != nil {
		n.publishStop(stopRecord{Reason: stopError, Node: n.index, Host: myHost, Detail: err.Error()})
		return ExitUsage, err
	}
	// The node serving the rendezvous watches the job (status lines, metrics) and writes the
	// flight-recorder file, which nodes on a shared file system would otherwise all write; every
	// node prints the end.
	view.flightFile = n.srv != nil
	guard := startGuard(n.opts.AfterOrphans)
	defer guard.Close()
	runner := &proc.Runner{
		Starter: proc.LocalStarter{Guard: guard, Bind: n.bind}, Stdout: rankOut, Stderr: rankErr,
		OutputDir: o.OutputDir, Timestamps: o.Timestamps, Plain: o.PlainOutput,
		OnFailure: func(r proc.Result) {
			rec := recordOf(r)
			n.publishStop(stopRecord{Reason: stopFailed, Node: n.index, Host: myHost, Rank: &rec})
		},
	}
	results, first := runner.Run(runCtx, workers)

	done := doneRecord{Node: n.index, Host: myHost, Failed: first != nil}
	for _, r := range results {
		if !r.Exit.Failed() {
			// Only a failed rank's tail is shown (the summary of a rank that ended early, which
			// exits 0, quotes the records instead): a job of many ranks keeps its done records small.
			r.StderrTail = nil
		}
		done.Ranks = append(done.Ranks, recordOf(r))
	}
	if n.lostRendezvous() == nil {
		b, _ := json.Marshal(done)
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		stored, err := n.rv.SetIfAbsent(sctx, keyDone(n.index), b)
		cancel()
		switch {
		case err != nil:
			n.setLost(err)
		case !stored:
			// The serving node declared this node lost just before: its record is the one every
			// node reads, so that all of them print the same outcome.
			slog.Warn("this node was declared lost before it reported how its ranks ended", "node", n.index)
		}
	}
	if err := n.lostRendezvous(); err != nil {
		view.stop()
		return n.reportLost(results, first, err)
	}
	dones := n.collectDones()
	// Every node's ranks have ended (or the wait for them has): their last reports are in.
	view.stop()
	if err := n.lostRendezvous(); err != nil {
		return n.reportLost(results, first, err)
	}
	records := view.failures(len(slots))
	all, firstAll, code, note := outcome(dones, n.currentStop(), n.names, records)
	reported := 0
	for _, d := range dones {
		if d != nil && d.Lost == "" {
			reported++
		}
	}
	n.finish(reported)
	if firstAll != nil {
		fmt.Fprint(n.stderr, proc.Summary(all, firstAll, records))
		view.end(fmt.Sprintf("rank %d on %s: %s", firstAll.Slot.Rank, firstAll.Slot.Host, firstAll.Exit), o.OutputDir)
	} else {
		view.end("", "")
	}
	err = nil
	if note != "" {
		err = errors.New(note)
	}
	writeOutcome(o.OutcomeFile, staticOutcome(code, err, code == ExitInterrupted && firstAll == nil, all, firstAll, records), n.stderr)
	return code, err
}

// publishStop tells every node to stop, once per node; the first node's record is the one all see.
func (n *node) publishStop(rec stopRecord) {
	n.mu.Lock()
	if n.stopSent || n.lostErr != nil {
		n.mu.Unlock()
		return
	}
	n.stopSent = true
	n.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := n.rv.Add(ctx, keyStopN, 1)
	if err != nil {
		n.setLost(err)
		return
	}
	if c > 1 {
		return // another node is already stopping the job
	}
	b, _ := json.Marshal(rec)
	if err := n.rv.Set(ctx, keyStop, b); err != nil {
		n.setLost(err)
	}
}

// watchStop waits for any node's stop record and stops this node's ranks.
func (n *node) watchStop(ctx context.Context, stopRanks func()) {
	v, err := n.rv.Get(ctx, keyStop)
	if err != nil {
		if ctx.Err() == nil {
			n.setLost(err)
			stopRanks()
		}
		return
	}
	var rec stopRecord
	if err := json.Unmarshal(v, &rec); err != nil {
		rec = stopRecord{Reason: "unreadable stop record: " + err.Error(), Node: -1}
	}
	n.mu.Lock()
	if n.stop == nil {
		n.stop = &rec
		close(n.stopped)
	}
	n.mu.Unlock()
	stopRanks()
}

// heartbeat lets the serving node tell a silent node from a busy one (sendBeats).
func (n *node) heartbeat(ctx context.Context) {
	if n.srv != nil {
		return
	}
	if err := sendBeats(ctx, n.rv, keyBeat(n.index), beatInterval, 0); err != nil {
		n.setLost(err)
	}
}

// servedStore is what watchNodes needs of the store this node serves (a *rendezvous.Server).
type servedStore interface {
	TryGet(key string) (value []byte, ok bool, err error)
	SetIfAbsent(key string, value []byte) (stored bool, err error)
}

// watchNodes, on the serving node, declares a node that stopped beating (and has not reported its
// ranks' end) lost: it stops the job and reports the node's end in its place. The node may report
// at that very moment: whichever record is written first stands (SetIfAbsent), and the job is
// stopped only if it is the lost one.
func (n *node) watchNodes(ctx context.Context, st servedStore) {
	last := make([]beatWatch, len(n.infos))
	start := time.Now()
	for i := range last {
		last[i] = newBeatWatch(start)
	}
	t := time.NewTicker(beatInterval / 2)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for i := range n.infos {
			if i == n.index {
				continue
			}
			if _, ok, _ := st.TryGet(keyDone(i)); ok {
				continue
			}
			v, _, _ := st.TryGet(keyBeat(i))
			silent := last[i].silent(v, time.Now())
			limit := nodeSilence
			select {
			case <-n.stopped:
				// The job is stopping already (often because this node's ranks saw that one's
				// vanish): a live node keeps beating while its ranks stop, so a few missed beats
				// are enough, and waiting the full silence would only delay the exit.
				limit = min(limit, stoppingSilence)
			default:
			}
			if silent < limit {
				continue
			}
			why := fmt.Sprintf("node %d on %s stopped answering the rendezvous (no heartbeat for %s)", i, n.names[i], limit)
			b, _ := json.Marshal(doneRecord{Node: i, Host: n.names[i], Lost: why})
			if stored, _ := st.SetIfAbsent(keyDone(i), b); stored {
				n.publishStop(stopRecord{Reason: stopLost, Node: i, Host: n.names[i], Detail: why})
			}
		}
	}
}

func (n *node) setLost(err error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.lostErr == nil {
		n.lostErr = err
		close(n.lost)
	}
}

func (n *node) lostRendezvous() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.lostErr
}

func (n *node) currentStop() *stopRecord {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.stop
}

// reportLost ends a node that lost the rendezvous: its own ranks are stopped; what the others did
// is unknown.
func (n *node) reportLost(results []proc.Result, first *proc.Result, err error) (int, error) {
	msg := fmt.Sprintf("lost the rendezvous at %s (%v): stopped this node's ranks; the other nodes' ranks are not known here", n.opts.Rendezvous, err)
	if first != nil {
		fmt.Fprint(n.stderr, proc.Summary(results, first, nil))
		return first.Exit.ShellCode(), errors.New(msg)
	}
	return 1, errors.New(msg)
}

// collectDones reads every node's done record. While the job runs it waits as long as the others
// run; once the job is being stopped (or the rendezvous is gone) only stoppedNodesWait more.
func (n *node) collectDones() []*doneRecord {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-n.stopped:
		case <-n.lost:
			cancel()
			return
		case <-ctx.Done():
			return
		}
		select {
		case <-time.After(stoppedNodesWait):
			cancel()
		case <-n.lost:
			cancel()
		case <-ctx.Done():
		}
	}()
	dones := make([]*doneRecord, len(n.infos))
	for i := range n.infos {
		v, err := n.rv.Get(ctx, keyDone(i))
		if err != nil {
			if ctx.Err() == nil {
				n.setLost(err)
				cancel()
			}
			continue
		}
		var d doneRecord
		if json.Unmarshal(v, &d) == nil {
			dones[i] = &d
		}
	}
	return dones
}

// finish acknowledges the outcome; the serving node keeps the rendezvous up until the nodes that
// reported have read it too (bounded by finishWait).
func (n *node) finish(reported int) {
	ctx, cancel := context.WithTimeout(context.Background(), finishWait)
	defer cancel()
	if _, err := n.rv.Add(ctx, keyFinished, 1); err != nil || n.srv == nil {
		return
	}
	for ctx.Err() == nil {
		v, _, _ := n.srv.TryGet(keyFinished)
		if c, _ := strconv.Atoi(string(v)); c >= reported {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// outcome turns every node's report into the job's results, the first rank to fail (the earliest
// end among ranks that failed on their own, on any node, traced by Blame through the ranks'
// failure records), the exit code and a note on what else went wrong (a node interrupted, lost or
// silent).
func outcome(dones []*doneRecord, stop *stopRecord, names []string, records map[int]report.Failure) (results []proc.Result, first *proc.Result, code int, note string) {
	var missing, lost []string
	for i, d := range dones {
		switch {
		case d == nil:
			missing = append(missing, fmt.Sprintf("node %d (%s)", i, names[i]))
		case d.Lost != "":
			lost = append(lost, d.Lost)
		}
		if d != nil {
			for _, r := range d.Ranks {
				results = append(results, r.result())
			}
		}
	}
	if stop != nil && stop.Reason == stopFailed && stop.Rank != nil {
		// The failed rank's node may be the one that did not report.
		found := false
		for _, r := range results {
			found = found || r.Slot.Rank == stop.Rank.Slot.Rank
		}
		if !found {
			results = append(results, stop.Rank.result())
		}
	}
	sort.Slice(results, func(a, b int) bool { return results[a].Slot.Rank < results[b].Slot.Rank })
	for i := range results {
		r := &results[i]
		if !r.Exit.Failed() || r.Stopped {
			continue
		}
		if first == nil || r.Ended.Before(first.Ended) {
			first = r
		}
	}
	var notes []string
	switch {
	case first != nil:
		code = first.Exit.ShellCode()
		first = proc.Blame(results, first, records)
		code = failureCode(first, code)
	case stop != nil && stop.Reason == stopInterrupted:
		notes = append(notes, fmt.Sprintf("interrupted on node %d (%s): stopped every rank", stop.Node, stop.Host))
		code = ExitInterrupted
	case stop != nil && stop.Reason != stopLost:
		notes = append(notes, fmt.Sprintf("job stopped by node %d (%s): %s", stop.Node, stop.Host, stop.Detail))
		code = 1
	case stop != nil || len(missing) > 0 || len(lost) > 0:
		code = 1
	}
	notes = append(notes, lost...)
	if len(missing) > 0 {
		notes = append(notes, "no report from "+strings.Join(missing, ", ")+": how their ranks ended is unknown")
	}
	return results, first, code, strings.Join(notes, "\n")
}
