package launch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"

	"github.com/kolo-dl/kolo/internal/launch/layout"
	"github.com/kolo-dl/kolo/internal/launch/proc"
	"github.com/kolo-dl/kolo/internal/observe/relay"
)

// A static job without ssh (node.go): the serving node waits (--start-timeout) for --nnodes nodes,
// gives each its node rank (nodeRanks), plans the ranks over the nodes in node-rank order
// (layout.Plan: -np ranks, or every node's slots) and runs them with runStatic. A node the job
// cannot have (it disagrees on --nnodes or -np, or claims a node rank another node holds) fails
// the job before it starts. What the serving node printed at the end (the summary, the end
// table) goes to every node.

// nodeRankAdvice ends every node rank conflict error.
const nodeRankAdvice = "give --node-rank to every node, each its own, or to none"

// staticNode is the serving node's static job.
type staticNode struct {
	n     *node
	nodes *nodeRegistry
	// stopped ends at the first reason (a jobStop) the job cannot start, or is stopped: the wait
	// for the nodes and the ranks run under it.
	stopped context.Context
	stop    context.CancelCauseFunc

	mu      sync.Mutex
	joined  int            // nodes admitted, this one included
	claimed map[int]string // node ranks claimed with --node-rank: the host of the node holding it
	np      int            // -np, from the first node that gave it
	ranks   map[string]int // each host's node rank, once planned
	ran     staticRan      // how the ranks ended
}

func newStaticNode(n *node) *staticNode {
	s := &staticNode{n: n, claimed: map[int]string{}}
	s.stopped, s.stop = context.WithCancelCause(context.Background())
	return s
}

// failure is why the job cannot start, or was stopped; nil while it can run.
func (s *staticNode) failure() *jobStop {
	if why, ok := context.Cause(s.stopped).(jobStop); ok {
		return &why
	}
	return nil
}

// serveStatic runs the static job on the serving node, with the nodes that join as its hosts.
func serveStatic(ctx context.Context, n *node, set elasticSettings) (int, error) {
	o := n.opts
	s := newStaticNode(n)
	self := NodeJoin{Hostname: n.host, Slots: n.slots, Static: true, NNodes: o.NNodes, NP: o.NP, NodeRank: o.NodeRank}
	s.admit(self)
	s.nodes = n.newRegistry(set, s.admit, self)
	s.nodes.welcome.Static, s.nodes.left = true, s.left
	s.nodes.log = func(format string, args ...any) {
		if o.Verbose {
			slog.Info(fmt.Sprintf(format, args...))
		}
	}
	if o.Verbose {
		slog.Info("serving the rendezvous", "at", o.Rendezvous, "nodes", o.NNodes)
	}
	stopPolling := s.nodes.polling(nil)
	var end bytes.Buffer // what every node prints at the end
	code, err := s.run(ctx, set, &end)
	stopPolling()
	if err != nil {
		fmt.Fprintf(&end, "kolo run: %v\n", err)
	}
	n.outcome = new(s.ran.outcome(code, err, code == ExitInterrupted && s.ran.first == nil))
	s.nodes.end(code, end.String(), *n.outcome)
	return code, err
}

// run waits for the nodes, plans and runs the ranks; end gets what the job's end prints.
func (s *staticNode) run(ctx context.Context, set elasticSettings, end *bytes.Buffer) (int, error) {
	n, o := s.n, s.n.opts
	select {
	case <-ctx.Done():
		return ExitInterrupted, errors.New("interrupted while the nodes met")
	case <-s.stopped.Done():
		return s.failure().code, *s.failure()
	case d := <-s.nodes.newest:
		if d.err != nil {
			return 1, s.arrivalError()
		}
	}

	members, ranks := s.members()
	hosts := make([]layout.Host, len(members))
	total := 0
	s.mu.Lock()
	s.ranks = map[string]int{}
	for i, r := range ranks {
		hosts[r] = layout.Host{Name: members[i].host, Slots: members[i].join.Slots}
		s.ranks[members[i].host] = r
		total += members[i].join.Slots
	}
	np := s.np
	s.mu.Unlock()
	if np == 0 {
		np = total
	}
	slots, err := layout.Plan(hosts, np)
	if err != nil {
		return ExitUsage, err
	}
	rv, err := n.localRendezvous(s.nodes)
	if err != nil {
		return ExitUsage, err
	}
	rvAddr, extra := rv(), workerExtraEnv(o)
	workers := make([]proc.Worker, len(slots))
	for i, sl := range slots {
		workers[i] = proc.Worker{Slot: sl, Argv: o.Command, Env: WorkerEnv(sl, rvAddr, n.jobID, string(n.secret), extra, o.Env)}
	}
	var closeGuard func()
	s.nodes.local, closeGuard = set.localStarter(o, n.bind)
	defer closeGuard()
	if o.Verbose {
		slog.Info("starting the ranks", "ranks", len(slots), "nodes", len(hosts), "rendezvous", rvAddr)
	}

	defer s.stop(nil)
	go func() {
		select {
		case <-ctx.Done():
			s.stop(jobStop{code: ExitInterrupted, why: fmt.Sprintf("interrupted on node %d (%s): stopped every rank", s.rankOf(s.n.host), s.n.host)})
		case <-s.stopped.Done():
		}
	}()
	return runStatic(s.stopped, o, staticRun{
		workers: workers, starter: s.nodes,
		store: relay.Local{S: n.srv.Store}, jobID: n.jobID, onFailure: s.nodes.hurry, end: end, host: s.n.host, ran: &s.ran,
	}, n.stdout, n.stderr)
}

// admit says why the job cannot have a node that registers (its own registration included), ""
// when it can. A node that disagrees with the others, or claims a node rank another node holds,
// fails the job: it cannot start as the nodes were told.
func (s *staticNode) admit(j NodeJoin) string {
	o := s.n.opts
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case !j.Static:
		return fmt.Sprintf("node on %s was started with elastic flags (%s), the serving node without: start every node with the same flags", j.Hostname, j.Flags)
	case s.joined >= o.NNodes:
		return fmt.Sprintf("%d nodes have joined the rendezvous at %s already (--nnodes %d): is another job using it?", s.joined, o.Rendezvous, o.NNodes)
	case j.NNodes != o.NNodes:
		return s.refuse(fmt.Sprintf("the nodes disagree on --nnodes: node on %s was started with --nnodes %d, the serving node with %d", j.Hostname, j.NNodes, o.NNodes))
	case j.NP != 0 && s.np != 0 && j.NP != s.np:
		return s.refuse(fmt.Sprintf("node on %s was started with -np %d, another node with -np %d", j.Hostname, j.NP, s.np))
	case j.NodeRank >= 0 && s.claimed[j.NodeRank] != "":
		s.stop(jobStop{code: ExitUsage, why: fmt.Sprintf("node rank %d was claimed by two nodes (the second on %s): %s", j.NodeRank, j.Hostname, nodeRankAdvice)})
		return fmt.Sprintf("node rank %d is taken by another node: %s", j.NodeRank, nodeRankAdvice)
	}
	if j.NodeRank >= 0 {
		s.claimed[j.NodeRank] = j.Hostname
	}
	if s.np == 0 {
		s.np = j.NP
	}
	s.joined++
	return ""
}

// refuse fails the job with why (a usage error) and returns it: the refused node says it too.
func (s *staticNode) refuse(why string) string {
	s.stop(jobStop{code: ExitUsage, why: why})
	return why
}

// left stops the job when a node leaves it (the registry's left); before the job starts, it
// cannot start.
func (s *staticNode) left(nd *jobNode, how departure, why string) {
	r := s.rankOf(nd.host)
	switch {
	case how == nodeLeft && r >= 0:
		s.stop(jobStop{code: ExitInterrupted, why: fmt.Sprintf("interrupted on node %d (%s): stopped every rank", r, nd.host)})
	case how == nodeLeft:
		s.stop(jobStop{code: 1, why: fmt.Sprintf("the node on %s left before the job started (%s)", nd.host, why)})
	case r >= 0:
		s.stop(jobStop{code: 1, why: fmt.Sprintf("node %d on %s stopped answering the rendezvous (%s)", r, nd.host, why)})
	default:
		s.stop(jobStop{code: 1, why: fmt.Sprintf("the node on %s stopped answering the rendezvous before the job started (%s)", nd.host, why)})
	}
	go s.nodes.hurry() // left is called with the registry locked
}

// rankOf is host's node rank, -1 before the ranks are planned.
func (s *staticNode) rankOf(host string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r, ok := s.ranks[host]; ok {
		return r
	}
	return -1
}

// arrivalError says, at --start-timeout, which nodes came and which did not.
func (s *staticNode) arrivalError() error {
	o := s.n.opts
	members, ranks := s.members()
	var here []string
	taken := map[int]bool{}
	for i, r := range ranks {
		here = append(here, fmt.Sprintf("node %d on %s with %s", r, members[i].host, countOf(members[i].join.Slots, "slot")))
		taken[r] = true
	}
	var missing []string
	for r := range o.NNodes {
		if !taken[r] {
			missing = append(missing, strconv.Itoa(r))
		}
	}
	return fmt.Errorf("waited %s (--start-timeout) at %s for %d nodes: %d arrived (%s); no sign of node %s",
		o.StartTimeout, o.Rendezvous, o.NNodes, len(members), strings.Join(here, ", "), strings.Join(missing, ", "))
}

// members lists the nodes in the job, in the order they joined, and their node ranks.
func (s *staticNode) members() ([]jobNode, []int) {
	members := s.nodes.members()
	claims := make([]int, len(members))
	for i, m := range members {
		claims[i] = m.join.NodeRank
	}
	return members, nodeRanks(claims)
}

// nodeRanks gives each node, in the order they joined, its node rank: the one it claimed
// (claims[i] >= 0), else the lowest one no node claimed or was given.
func nodeRanks(claims []int) []int {
	taken := map[int]bool{}
	for _, c := range claims {
		if c >= 0 {
			taken[c] = true
		}
	}
	out := make([]int, len(claims))
	next := 0
	for i, c := range claims {
		if c >= 0 {
			out[i] = c
			continue
		}
		for taken[next] {
			next++
		}
		out[i], taken[next] = next, true
	}
	return out
}
