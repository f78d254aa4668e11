// Package launch is kolo run's job logic: it turns the parsed flags (internal/launch/flags) into a job and
// drives it to its end, hosting the rendezvous its workers meet at and giving each worker the
// environment contract of docs/design.md (jobenv; settings declares the names).
//
// The jobs: hostjob.go is a static job started from one machine (ranks local and over ssh), and
// runStatic the static runner every static job uses; elasticjob.go is the elastic driver (ranks
// local, over ssh or as Slurm job steps). No-ssh jobs, whose nodes each run kolo run and meet at a
// rendezvous, have one node protocol (node.go; its keys and records, nodeproto.go): the serving node keeps a registry of the nodes
// (noderegistry.go) and runs a static job (staticnode.go: the static runner over the nodes that
// joined) or the elastic driver (elasticnode.go) over them; every other node runs the node agent
// (nodeagent.go); nodebeat.go is the heartbeat the serving node watches them with. Where ranks go
// is internal/launch/layout's; what an elastic job does next is internal/launch/elastic's pure planner; starting,
// supervising and stopping processes (locally, over ssh, with srun) and blaming the failed rank is
// internal/launch/proc's: the static runner, the elastic driver and the node agent are policies over its one
// Supervisor (what to start, what an exit means) and never signal a process themselves.
//
// This package must not start or signal a rank's process itself (internal/launch/proc does: the one
// command run here is the host discovery script), and must not know about tensors or the engine.
package launch
