package jobenv

import (
	"log/slog"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// Variables as mpirun (OpenMPI 4.1.4) and srun (Slurm 22.05) set them on this machine, trimmed to
// what matters; see /work/shared/TESTBED.md.
func ompiEnv(rank, size, localRank, localSize int) map[string]string {
	return map[string]string{
		"OMPI_COMM_WORLD_RANK": itoa(rank), "OMPI_COMM_WORLD_SIZE": itoa(size),
		"OMPI_COMM_WORLD_LOCAL_RANK": itoa(localRank), "OMPI_COMM_WORLD_LOCAL_SIZE": itoa(localSize),
		"OMPI_COMM_WORLD_NODE_RANK": itoa(localRank), "OMPI_MCA_ess_base_jobid": "1336082433",
		"PMIX_NAMESPACE": "1336082433", "PMIX_RANK": itoa(rank), "PMIX_HOSTNAME": "vm",
	}
}

func slurmEnv(procID, localID, nodeID int, ntasks, tasksPerNode, nodelist string) map[string]string {
	return map[string]string{
		"SLURM_PROCID": itoa(procID), "SLURM_LOCALID": itoa(localID), "SLURM_NODEID": itoa(nodeID),
		"SLURM_NTASKS": ntasks, "SLURM_STEP_NUM_TASKS": ntasks, "SLURM_STEP_TASKS_PER_NODE": tasksPerNode,
		"SLURM_TASKS_PER_NODE": tasksPerNode, "SLURM_STEP_NODELIST": nodelist, "SLURM_JOB_NODELIST": nodelist,
		"SLURM_JOB_ID": "17", "SLURM_JOBID": "17", "SLURM_STEP_ID": "0", "SLURM_STEPID": "0",
		"SLURMD_NODENAME": "ignored", "SRUN_DEBUG": "3",
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

func with(env map[string]string, kv ...string) map[string]string {
	out := map[string]string{}
	for k, v := range env {
		out[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] == "<unset>" {
			delete(out, kv[i])
		} else {
			out[kv[i]] = kv[i+1]
		}
	}
	return out
}

func TestDetect(t *testing.T) {
	koloEnv := Encode(Job{Rank: 1, Size: 2, LocalRank: 1, LocalSize: 2, CrossSize: 1, Hostname: "h", Rendezvous: "h:1", JobID: "j"})
	tests := []struct {
		name     string
		env      map[string]string
		launcher Launcher
		want     Job
		err      string
	}{
		{"plain process", map[string]string{"PATH": "/bin"}, NoLauncher, Single("me"), ""},
		{"kolo run", koloEnv, KoloRun,
			Job{Rank: 1, Size: 2, LocalRank: 1, LocalSize: 2, CrossSize: 1, Hostname: "h", Rendezvous: "h:1", JobID: "j"}, ""},
		{"kolo run wins over slurm", with(koloEnv, "SLURM_PROCID", "0", "SLURM_STEP_ID", "0"), KoloRun,
			Job{Rank: 1, Size: 2, LocalRank: 1, LocalSize: 2, CrossSize: 1, Hostname: "h", Rendezvous: "h:1", JobID: "j"}, ""},

		{"mpirun one host", ompiEnv(2, 3, 2, 3), MPIRun,
			Job{Rank: 2, Size: 3, LocalRank: 2, LocalSize: 3, CrossSize: 1, Hostname: "me", JobID: "mpirun-1336082433"}, ""},
		{"mpirun two hosts: cross left to the rendezvous", ompiEnv(3, 4, 1, 2), MPIRun,
			Job{Rank: 3, Size: 4, LocalRank: 1, LocalSize: 2, CrossSize: 0, Hostname: "me", JobID: "mpirun-1336082433"}, ""},
		{"mpirun with -x address and job id", with(ompiEnv(0, 2, 0, 2), Rendezvous, "10.0.0.1:4000", JobID, "train/7"), MPIRun,
			Job{Rank: 0, Size: 2, LocalRank: 0, LocalSize: 2, CrossSize: 1, Hostname: "me", Rendezvous: "10.0.0.1:4000", JobID: "train_7"}, ""},
		{"mpirun OpenMPI 5 namespace", with(ompiEnv(0, 2, 0, 2), "OMPI_MCA_ess_base_jobid", "<unset>", "PMIX_NAMESPACE", "prterun-vm-123@1"), MPIRun,
			Job{Rank: 0, Size: 2, LocalRank: 0, LocalSize: 2, CrossSize: 1, Hostname: "me", JobID: "mpirun-prterun-vm-123@1"}, ""},
		{"mpirun inside sbatch: mpirun wins", with(ompiEnv(1, 2, 1, 2), "SLURM_PROCID", "0", "SLURM_STEP_ID", "0"), MPIRun,
			Job{Rank: 1, Size: 2, LocalRank: 1, LocalSize: 2, CrossSize: 1, Hostname: "me", JobID: "mpirun-1336082433"}, ""},
		{"mpirun no local size", with(ompiEnv(0, 2, 0, 2), "OMPI_COMM_WORLD_LOCAL_SIZE", "<unset>"), "", Job{}, "OMPI_COMM_WORLD_LOCAL_SIZE is not set"},
		{"mpirun bad rank", with(ompiEnv(0, 2, 0, 2), "OMPI_COMM_WORLD_RANK", "x"), "", Job{}, `OMPI_COMM_WORLD_RANK="x" is not an integer`},
		{"mpirun no job id", with(ompiEnv(0, 2, 0, 2), "OMPI_MCA_ess_base_jobid", "<unset>", "PMIX_NAMESPACE", "<unset>"), "", Job{}, "set KOLO_JOB_ID"},

		// srun -n 2 on one node, as listed in TESTBED.md.
		{"srun -n 2", slurmEnv(1, 1, 0, "2", "2", "vm"), Srun,
			Job{Rank: 1, Size: 2, LocalRank: 1, LocalSize: 2, CrossRank: 0, CrossSize: 1, Hostname: "vm", JobID: "slurm-17.0"}, ""},
		// srun -n 7 over node[01-03] with 3,3,1 tasks: rank 6 is node03's only task.
		{"srun uneven: last node", slurmEnv(6, 0, 2, "7", "3(x2),1", "node[01-03]"), Srun,
			Job{Rank: 6, Size: 7, LocalRank: 0, LocalSize: 1, CrossRank: 2, CrossSize: 3, Hostname: "node03", JobID: "slurm-17.0"}, ""},
		{"srun uneven: local rank 2 only on two nodes", slurmEnv(5, 2, 1, "7", "3(x2),1", "node[01-03]"), Srun,
			Job{Rank: 5, Size: 7, LocalRank: 2, LocalSize: 3, CrossRank: 1, CrossSize: 2, Hostname: "node02", JobID: "slurm-17.0"}, ""},
		{"srun older slurm: no STEP_ variables", with(slurmEnv(0, 0, 0, "2", "2", "vm"), "SLURM_STEP_NUM_TASKS", "<unset>",
			"SLURM_STEP_TASKS_PER_NODE", "<unset>", "SLURM_STEP_NODELIST", "<unset>", "SLURM_STEP_ID", "<unset>"), Srun,
			Job{Rank: 0, Size: 2, LocalRank: 0, LocalSize: 2, CrossSize: 1, Hostname: "vm", JobID: "slurm-17.0"}, ""},
		// An exported but empty KOLO_JOB_ID names nothing: the launcher's own id is used, or every
		// such job would share one rendezvous file.
		{"srun with an empty job id", with(slurmEnv(1, 1, 0, "2", "2", "vm"), JobID, ""), Srun,
			Job{Rank: 1, Size: 2, LocalRank: 1, LocalSize: 2, CrossRank: 0, CrossSize: 1, Hostname: "vm", JobID: "slurm-17.0"}, ""},
		{"mpirun with an empty job id", with(ompiEnv(0, 2, 0, 2), JobID, " "), MPIRun,
			Job{Rank: 0, Size: 2, LocalRank: 0, LocalSize: 2, CrossSize: 1, Hostname: "me", JobID: "mpirun-1336082433"}, ""},
		// The batch script of sbatch -n 3 has SLURM_PROCID=0 and SLURM_NTASKS=3 but is no task.
		{"sbatch script itself", with(slurmEnv(0, 0, 0, "3", "3", "vm"), "SLURM_STEP_ID", "<unset>", "SLURM_STEPID", "<unset>"),
			NoLauncher, Single("me"), ""},
		{"srun counts disagree", slurmEnv(0, 0, 0, "5", "2(x2)", "a,b"), "", Job{}, `adds up to 4 tasks but SLURM_STEP_NUM_TASKS=5`},
		{"srun node id outside", slurmEnv(0, 0, 3, "4", "2(x2)", "a,b"), "", Job{}, "SLURM_NODEID=3"},
		{"srun bad tasks per node", slurmEnv(0, 0, 0, "2", "2(x", "a"), "", Job{}, "SLURM_STEP_TASKS_PER_NODE"},
		{"srun local id outside", slurmEnv(1, 3, 0, "2", "2", "vm"), "", Job{}, "local rank 3 outside [0, 2)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, err := Detect(tc.env, "me")
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d.Launcher != tc.launcher || d.Job != tc.want {
				t.Errorf("got %q %+v\nwant %q %+v", d.Launcher, d.Job, tc.launcher, tc.want)
			}
		})
	}
}

func TestParseTasksPerNode(t *testing.T) {
	tests := []struct {
		in   string
		want []int
		err  bool
	}{
		{"4", []int{4}, false},
		{"2(x3),1", []int{2, 2, 2, 1}, false},
		{"1,2(x2),3", []int{1, 2, 2, 3}, false},
		{"", nil, true},
		{"x", nil, true},
		{"2(x0)", nil, true},
		{"2(x3", nil, true},
	}
	for _, tc := range tests {
		got, err := ParseTasksPerNode(tc.in)
		if (err != nil) != tc.err || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ParseTasksPerNode(%q) = %v, %v", tc.in, got, err)
		}
	}
}

// CrossFromHosts must agree with what launch.Plan computes for the same placements (plan_test.go).
func TestCrossFromHosts(t *testing.T) {
	hosts := []string{"a", "a", "a", "b", "c", "c"} // a:3, b:1, c:2
	want := [][2]int{{0, 3}, {0, 2}, {0, 1}, {1, 3}, {2, 3}, {1, 2}}
	local := []int{0, 1, 2, 0, 0, 1}
	for r := range hosts {
		cr, cs := CrossFromHosts(hosts, hosts[r], local[r])
		if [2]int{cr, cs} != want[r] {
			t.Errorf("rank %d: cross %d/%d, want %v", r, cr, cs, want[r])
		}
	}
}

func TestParseLogLevel(t *testing.T) {
	for in, want := range map[string]slog.Level{"trace": slog.LevelDebug - 4, "DEBUG": slog.LevelDebug,
		"Info": slog.LevelInfo, "WARNING": slog.LevelWarn, "warn": slog.LevelWarn, "ERROR": slog.LevelError, "FATAL": slog.LevelError + 4} {
		if got, err := ParseLogLevel(in); err != nil || got != want {
			t.Errorf("ParseLogLevel(%q) = %v, %v", in, got, err)
		}
	}
	if _, err := ParseLogLevel("loud"); err == nil || !strings.Contains(err.Error(), "TRACE, DEBUG") {
		t.Errorf("bad level: %v", err)
	}
}

func TestSafeID(t *testing.T) {
	for in, want := range map[string]string{"slurm-1.0": "slurm-1.0", "a/b c": "a_b_c", "..": "_..", "prterun-x@1": "prterun-x@1"} {
		if got := safeID(in); got != want {
			t.Errorf("safeID(%q) = %q, want %q", in, got, want)
		}
	}
}
