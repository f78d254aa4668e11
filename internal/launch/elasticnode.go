package launch

import (
	"context"
	"fmt"

	"github.com/kolo-dl/kolo/internal/launch/elastic"
)

// Elastic mode without ssh (node.go): the serving node runs the elastic event loop (elasticJob) and
// its planner over the nodes in the job as hosts: itself, and every node that joined and has not
// left. A node joining is a host becoming available with its slots (--nproc-per-node, -H
// localhost:N); a node whose kolo run stops (it says so) or that stops heartbeating is a host
// leaving, and its workers are lost. The loop takes the exit of another node's worker (NodeExit)
// as a local worker's. The rendezvous and the planner live on the serving node: when it dies, the
// job ends on every node.

// serveElastic runs the job's event loop on the serving node, with the nodes as its hosts.
func serveElastic(ctx context.Context, n *node, set elasticSettings) (int, error) {
	o := n.opts
	planner, err := elastic.NewPlanner(o.ElasticConfig())
	if err != nil {
		return ExitUsage, err
	}
	nodes := n.newRegistry(set, func(join NodeJoin) string {
		if join.Static || join.Flags != o.ElasticNodeFlags() {
			return fmt.Sprintf("node on %s was started with %s, the serving node with %s: give every node the same elastic flags", join.Hostname, orDash(join.Flags), o.ElasticNodeFlags())
		}
		return ""
	}, NodeJoin{})
	nodes.welcome.Timeout = planner.Config().Timeout
	var closeGuard func()
	nodes.local, closeGuard = set.localStarter(o, n.bind)
	defer closeGuard()
	j := newElasticJob(o, set, planner, n.srv, nodes, string(n.secret), n.jobID, n.stdout, n.stderr)
	rv, err := n.localRendezvous(nodes)
	if err != nil {
		return ExitUsage, err
	}
	j.workerRendezvous = func(string) string { return rv() }
	nodes.log = j.log
	j.log("serving the rendezvous at %s: host %s (%s); the first round waits for %s (--nnodes)", o.Rendezvous, n.host, countOf(n.slots, "slot"), countOf(nodes.nnodes, "node"))

	stopPolling := nodes.polling(j.started)
	code, err := j.run(ctx, nodes.listings)
	stopPolling()
	note := j.endNote
	switch {
	case note == "" && err != nil:
		note = "kolo run: elastic: " + err.Error()
	case note == "" && code == 0:
		note = fmt.Sprintf("kolo run: elastic: the job is done: every worker of round %d exited 0", j.round.Number)
	}
	n.outcome = new(j.outcome(code, err, code == ExitInterrupted))
	nodes.end(code, note, *n.outcome)
	return code, err
}
