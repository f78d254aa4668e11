package jobenv

import (
	"cmp"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/kolo-dl/kolo/internal/settings"
)

// Launcher names what started a worker process.
type Launcher string

const (
	NoLauncher Launcher = ""         // a plain process: a world of size 1
	KoloRun    Launcher = "kolo run" // KOLO_RANK and the rest of the contract are set
	MPIRun     Launcher = "mpirun"   // OpenMPI's mpirun (OMPI_COMM_WORLD_*)
	Srun       Launcher = "srun"     // a Slurm job step (SLURM_PROCID, SLURM_STEP_ID, ...)
)

// Variables a worker started by mpirun or srun may be given (mpirun -x, srun --export), beside
// Rendezvous and Secret.
var (
	SecretFile    = settings.SecretFile.Name    // a file holding the job secret, instead of KOLO_SECRET
	HorovodSecret = settings.Secret.Horovod[0]  // Horovod's name for the secret, read after kolo's (auth.JobSecret)
	RendezvousDir = settings.RendezvousDir.Name // where rank 0 publishes the rendezvous address; default ~/.kolo/rendezvous
)

// Detected is the Job that the environment describes and who wrote it.
//
// Under mpirun and srun nobody hosts a rendezvous: Job.Rendezvous is empty unless the user set
// KOLO_RENDEZVOUS_ADDR, and rank 0 must host one (package bootstrap does). Job.CrossSize is 0 when
// the launcher does not say which hosts run which ranks (mpirun): world.Connect derives it from the
// hosts every rank publishes at the rendezvous.
type Detected struct {
	Job      Job
	Launcher Launcher
}

// Detect reads the Job from the environment of a worker. The order matters: kolo run's contract
// wins (kolo run may itself run inside a Slurm allocation), then mpirun (whose ranks inherit the
// SLURM_* variables of the batch step when mpirun runs inside sbatch), then an srun step. A
// process that none of them started is a world of size 1 on hostname, as is Slurm's batch script
// itself (it sees SLURM_PROCID=0 and SLURM_NTASKS but is no task of a step: no SLURM_STEP_ID).
func Detect(env map[string]string, hostname string) (Detected, error) {
	switch {
	case has(env, Rank):
		j, err := Decode(env)
		return Detected{Job: j, Launcher: KoloRun}, err
	case has(env, "OMPI_COMM_WORLD_RANK"):
		j, err := fromOpenMPI(env, hostname)
		if err != nil {
			return Detected{}, fmt.Errorf("environment of an mpirun rank: %w", err)
		}
		return Detected{Job: j, Launcher: MPIRun}, nil
	case has(env, "SLURM_PROCID") && (has(env, "SLURM_STEP_ID") || has(env, "SLURM_STEPID")):
		j, err := fromSlurm(env, hostname)
		if err != nil {
			return Detected{}, fmt.Errorf("environment of a Slurm task: %w", err)
		}
		return Detected{Job: j, Launcher: Srun}, nil
	}
	return Detected{Job: Single(hostname)}, nil
}

func has(env map[string]string, k string) bool {
	_, ok := env[k]
	return ok
}

// present is name if env has it, else otherwise.
func present(env map[string]string, name, otherwise string) string {
	if has(env, name) {
		return name
	}
	return otherwise
}

// fromOpenMPI reads the ranks mpirun gives every process. OpenMPI says nothing about which hosts
// hold which ranks except through LOCAL_SIZE, so the cross rank is left to world.Connect unless
// every rank is on this host.
func fromOpenMPI(env map[string]string, hostname string) (Job, error) {
	var j Job
	if err := readInts(env, []intVar{
		{"OMPI_COMM_WORLD_RANK", &j.Rank}, {"OMPI_COMM_WORLD_SIZE", &j.Size},
		{"OMPI_COMM_WORLD_LOCAL_RANK", &j.LocalRank}, {"OMPI_COMM_WORLD_LOCAL_SIZE", &j.LocalSize},
	}); err != nil {
		return Job{}, err
	}
	if j.LocalSize == j.Size {
		j.CrossSize = 1
	}
	j.Hostname = hostname
	j.Rendezvous = env[Rendezvous]
	// PMIX_NAMESPACE is the job's name for PMIx (OpenMPI 4 and 5); OpenMPI 4 also has the ORTE job id.
	id := firstSet(env, JobID, "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid")
	if id == "" {
		return Job{}, fmt.Errorf("no job id (PMIX_NAMESPACE, OMPI_MCA_ess_base_jobid): set %s to one value for every rank (mpirun -x %s=...)", JobID, JobID)
	}
	if firstSet(env, JobID) == "" {
		id = "mpirun-" + id
	}
	j.JobID = safeID(id)
	return j, j.checkNumbers()
}

// fromSlurm reads a task of an srun step. Slurm says how many tasks each node of the step runs
// (SLURM_STEP_TASKS_PER_NODE), so local size and cross rank follow without a rendezvous.
func fromSlurm(env map[string]string, hostname string) (Job, error) {
	var j Job
	var nodeID int
	sizeVar := present(env, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
	if err := readInts(env, []intVar{
		{"SLURM_PROCID", &j.Rank}, {sizeVar, &j.Size}, {"SLURM_LOCALID", &j.LocalRank}, {"SLURM_NODEID", &nodeID},
	}); err != nil {
		return Job{}, err
	}
	tpnVar := present(env, "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
	perNode, err := ParseTasksPerNode(env[tpnVar])
	if err != nil {
		return Job{}, fmt.Errorf("%s: %w", tpnVar, err)
	}
	if nodeID < 0 || nodeID >= len(perNode) {
		return Job{}, fmt.Errorf("SLURM_NODEID=%d but %s=%q lists %d nodes", nodeID, tpnVar, env[tpnVar], len(perNode))
	}
	total := 0
	for _, n := range perNode {
		total += n
	}
	if total != j.Size {
		return Job{}, fmt.Errorf("%s=%q adds up to %d tasks but %s=%d", tpnVar, env[tpnVar], total, sizeVar, j.Size)
	}
	j.LocalSize = perNode[nodeID]
	for i, n := range perNode {
		if n > j.LocalRank {
			if i == nodeID {
				j.CrossRank = j.CrossSize
			}
			j.CrossSize++
		}
	}
	// The step's node list names this node as Slurm knows it; every task of a node agrees on it.
	j.Hostname = hostname
	if nl := firstSet(env, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"); nl != "" {
		nodes, err := ExpandNodelist(nl)
		if err != nil {
			return Job{}, err
		}
		if len(nodes) == len(perNode) {
			j.Hostname = nodes[nodeID]
		}
	}
	j.Rendezvous = env[Rendezvous]
	jobID, step := cmp.Or(env["SLURM_JOB_ID"], env["SLURM_JOBID"]), firstSet(env, "SLURM_STEP_ID", "SLURM_STEPID")
	switch {
	case firstSet(env, JobID) != "": // an exported but empty KOLO_JOB_ID would give every job one name
		j.JobID = safeID(firstSet(env, JobID))
	case jobID == "":
		return Job{}, fmt.Errorf("SLURM_JOB_ID is not set")
	default:
		j.JobID = safeID("slurm-" + jobID + "." + step)
	}
	return j, j.checkNumbers()
}

// ParseTasksPerNode expands Slurm's tasks-per-node syntax: "2(x3),1" -> [2 2 2 1].
func ParseTasksPerNode(s string) ([]int, error) {
	var out []int
	for _, item := range strings.Split(strings.TrimSpace(s), ",") {
		count, times := item, "1"
		if i := strings.Index(item, "(x"); i >= 0 && strings.HasSuffix(item, ")") {
			count, times = item[:i], item[i+2:len(item)-1]
		}
		n, err1 := strconv.Atoi(count)
		k, err2 := strconv.Atoi(times)
		if err1 != nil || err2 != nil || n < 0 || k < 1 || k > maxNodes {
			return nil, fmt.Errorf("%q: want counts like 2(x3),1", s)
		}
		for ; k > 0; k-- {
			out = append(out, n)
		}
		if len(out) > maxNodes {
			return nil, fmt.Errorf("%q: more than %d nodes", s, maxNodes)
		}
	}
	return out, nil
}

// CrossFromHosts derives the cross rank and size of a rank from every rank's host (hosts[r] is
// rank r's host): among the hosts that run a rank with this local rank, in the order their first
// rank appears, the position of this host. It is what launch.Plan computes for kolo run's plans.
func CrossFromHosts(hosts []string, host string, localRank int) (crossRank, crossSize int) {
	count := map[string]int{}
	var order []string
	for _, h := range hosts {
		if count[h] == 0 {
			order = append(order, h)
		}
		count[h]++
	}
	for _, h := range order {
		if count[h] > localRank {
			if h == host {
				crossRank = crossSize
			}
			crossSize++
		}
	}
	return crossRank, crossSize
}

var errUnset = errors.New("is not set")

type intVar struct {
	name string
	dst  *int
}

func readInts(env map[string]string, vars []intVar) error {
	for _, v := range vars {
		s, ok := env[v.name]
		if !ok {
			return fmt.Errorf("%s %w", v.name, errUnset)
		}
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("%s=%q is not an integer", v.name, s)
		}
		*v.dst = n
	}
	return nil
}

func firstSet(env map[string]string, names ...string) string {
	for _, k := range names {
		if v := strings.TrimSpace(env[k]); v != "" {
			return v
		}
	}
	return ""
}

var unsafeID = regexp.MustCompile(`[^A-Za-z0-9_.@-]`)

// safeID keeps a launcher's job id usable as a file name (it names the rendezvous file).
func safeID(s string) string {
	s = unsafeID.ReplaceAllString(s, "_")
	if len(s) > 100 {
		s = s[:100]
	}
	if strings.Trim(s, ".") == "" {
		s = "_" + s // never "." or ".."
	}
	return s
}
