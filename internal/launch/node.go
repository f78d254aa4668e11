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
	"syscall"
	"time"

	"github.com/kolo-dl/kolo/internal/auth"
	"github.com/kolo-dl/kolo/internal/jobenv"
	"github.com/kolo-dl/kolo/internal/launch/flags"
	"github.com/kolo-dl/kolo/internal/launch/layout"
	"github.com/kolo-dl/kolo/internal/launch/proc"
	"github.com/kolo-dl/kolo/internal/netif"
	"github.com/kolo-dl/kolo/internal/rendezvous"
)

// No-ssh mode: every node of the job runs `kolo run --rendezvous HOST:PORT --nnodes N ...` itself
// (a container, a Kubernetes pod, a batch system's per-node step), the way torchrun does. The node
// that owns HOST serves the rendezvous and runs the job; every other node joins it as a host
// (nodeagent.go), starts and stops its own workers when the serving node orders it to, reports
// how they ended and heartbeats (nodebeat.go). The serving node keeps the registry of the nodes
// (noderegistry.go) and starts its own workers itself and the others' through their nodes
// (nodeRegistry.Start). A static job (staticnode.go) waits for --nnodes nodes, plans its ranks over them
// in node-rank order and runs them once, as a job started from one machine does; a node leaving
// or falling silent stops it. An elastic job (elasticnode.go) hands the nodes to the elastic
// driver as its hosts. Either way the job ends on the serving node, which sends every node the
// exit code and what to print, so that every node prints the same end and exits with the same
// code. The keys and records are nodeproto.go's.

// keyJob holds the job's jobRecord, set by the serving node.
const keyJob = "launch/job"

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

// nodeSlots is how many ranks (workers) this node runs. In elastic mode -np counts the job's ranks,
// so it says nothing about a node's.
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
	case o.Elastic():
		return 0, errors.New("say how many workers this node runs: --nproc-per-node N or -H localhost:N (in elastic mode -np, --min-np and --max-np count the job's ranks)")
	case o.NP > 0:
		if o.NP%o.NNodes != 0 {
			return 0, fmt.Errorf("-np %d does not split evenly over --nnodes %d: give each node --nproc-per-node", o.NP, o.NNodes)
		}
		return o.NP / o.NNodes, nil
	}
	return 0, errors.New("say how many ranks this node runs: --nproc-per-node N, -H localhost:N, or -np TOTAL (split evenly over --nnodes)")
}

// RunNode runs this node's part of a no-ssh job, static or elastic (see the comment at the top of
// this file). It returns the job's exit code (the same on every node: 0, the first failing rank's,
// ExitInterrupted, ExitUsage, or 1) and an error to print, if any; the failure summary is already
// written to stderr.
func RunNode(ctx context.Context, opts *flags.Options, stdout, stderr io.Writer) (int, error) {
	return runNode(ctx, opts, elasticSettings{}, stdout, stderr)
}

func runNode(ctx context.Context, opts *flags.Options, set elasticSettings, stdout, stderr io.Writer) (code int, err error) {
	set.fill()
	n := &node{opts: opts, stdout: stdout, stderr: stderr}
	defer func() { writeOutcome(opts.OutcomeFile, finalOutcome(code, err, ctx.Err() != nil, n.outcome), stderr) }()
	if n.secret, err = NodeSecret(opts); err != nil {
		return ExitUsage, err
	}
	if n.slots, err = nodeSlots(opts); err != nil {
		return ExitUsage, err
	}
	if opts.BindTo == flags.BindCore {
		if n.bind, err = proc.NewBinding(n.slots, opts.BindOverload); err != nil {
			return ExitUsage, err
		}
	}
	defer n.close()
	cctx, cancel := context.WithTimeout(ctx, opts.StartTimeout)
	code, err = n.connect(cctx)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return ExitInterrupted, fmt.Errorf("interrupted while reaching the rendezvous: %w", err)
		}
		return code, err
	}
	if n.host, err = os.Hostname(); err != nil {
		return 1, fmt.Errorf("this node's host name: %w", err)
	}
	switch {
	case n.srv == nil:
		return joinJob(ctx, n, set)
	case opts.Elastic():
		return serveElastic(ctx, n, set)
	}
	return serveStatic(ctx, n, set)
}

// node is this node: its flags, and its connection to the rendezvous (and the rendezvous itself
// when it serves it).
type node struct {
	opts           *flags.Options
	bind           *proc.Binding // --bind-to core: this node's ranks' CPUs; nil: no binding
	secret         []byte
	host           string // this machine's name (os.Hostname)
	slots          int
	stdout, stderr io.Writer

	srv   *rendezvous.Server   // when this node serves the rendezvous
	lns   *rendezvousListeners // srv's
	rv    *rendezvous.Client
	port  string
	jobID string

	// outcome is the job's whole outcome (--outcome-file) once this node has it: from its own
	// ranks or workers when it serves the job, from the serving node's record when it joined one.
	outcome *Outcome
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

// localRendezvous returns what gives the rendezvous address the serving node's own
// workers dial. A worker tells its peers the address it reaches the rendezvous from, so that
// must not be loopback once other machines' workers are in the job: --network-interface's
// address, else HOST of --rendezvous when it is not loopback here, else the address this machine
// reaches another node from (loopback while every node is this machine).
func (n *node) localRendezvous(nodes *nodeRegistry) (func() string, error) {
	o := n.opts
	if o.NetworkInterface != "" {
		ip, _, err := netif.InterfaceIP(o.NetworkInterface)
		if err != nil {
			return nil, fmt.Errorf("--network-interface: %w", err)
		}
		addr := n.listenAt(net.JoinHostPort(ip.String(), n.port))
		return func() string { return addr }, nil
	}
	host, _, _ := net.SplitHostPort(o.Rendezvous)
	if ips, err := net.LookupIP(host); err == nil && len(ips) > 0 && !ips[0].IsLoopback() {
		return func() string { return n.listenAt(o.Rendezvous) }, nil
	}
	return func() string {
		for _, addr := range nodes.addrs() {
			if ip, err := netif.SourceIP(addr); err == nil && !ip.IsLoopback() {
				return n.listenAt(net.JoinHostPort(ip.String(), n.port))
			}
		}
		return n.listenAt(net.JoinHostPort("127.0.0.1", n.port))
	}, nil
}

// listenAt makes the rendezvous listen at addr's host too, where this node's workers dial it, and
// returns the address to dial.
func (n *node) listenAt(addr string) string {
	h, _, _ := net.SplitHostPort(addr)
	at, err := n.lns.at(h)
	if err != nil {
		slog.Warn("the rendezvous cannot listen where this node's workers dial it", "addr", addr, "err", err)
		return addr
	}
	return at
}

// newRegistry is the registry of the nodes of the job this node serves, admit saying which
// newcomers it refuses; this node, which registered self, is its first.
func (n *node) newRegistry(set elasticSettings, admit func(NodeJoin) string, self NodeJoin) *nodeRegistry {
	e := &nodeRegistry{
		st: n.srv, set: set, self: n.host, welcome: NodeWelcome{JobID: n.jobID}, admit: admit,
		nnodes: max(n.opts.NNodes, 1), startTimeout: n.opts.StartTimeout, startBy: time.Now().Add(n.opts.StartTimeout),
		byHost: map[string]*jobNode{}, handled: map[int]bool{}, newest: make(chan discovery, 1),
	}
	self.Slots = n.slots
	e.add(&jobNode{host: n.host, join: self}, time.Now())
	return e
}
