package launch

import (
	"fmt"
	"strings"
	"testing"
)

func TestSlurmAllocation(t *testing.T) {
	tests := []struct {
		name  string
		env   map[string]string
		slots int
		want  string // "" with ok false; else "job: host:slots ..."
		err   string
	}{
		{name: "not in Slurm", env: map[string]string{}},
		{name: "a task of a step is a worker, not a launcher",
			env: map[string]string{"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_JOB_NODELIST": "n1"}},
		{name: "tasks per node",
			env:  map[string]string{"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node[1-3]", "SLURM_TASKS_PER_NODE": "4(x2),2", "SLURM_JOB_CPUS_PER_NODE": "8(x3)"},
			want: "7: node1:4 node2:4 node3:2"},
		{name: "CPUs per node when no tasks were asked",
			env:  map[string]string{"SLURM_JOBID": "8", "SLURM_NODELIST": "a,b", "SLURM_JOB_CPUS_PER_NODE": "16,8"},
			want: "8: a:16 b:8"},
		{name: "--slots-per-host wins", slots: 2,
			env:  map[string]string{"SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "gpu[01-02]", "SLURM_TASKS_PER_NODE": "8(x2)"},
			want: "9: gpu01:2 gpu02:2"},
		{name: "no node list", env: map[string]string{"SLURM_JOB_ID": "7"}, err: "SLURM_JOB_NODELIST is not set"},
		{name: "no counts", env: map[string]string{"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n1"}, err: "give --slots-per-host"},
		{name: "counts disagree with the nodes",
			env: map[string]string{"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-3]", "SLURM_TASKS_PER_NODE": "4(x2)"}, err: "counts 2 nodes"},
		{name: "bad counts", env: map[string]string{"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n1", "SLURM_TASKS_PER_NODE": "four"}, err: "SLURM_TASKS_PER_NODE"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, ok, err := slurmAllocation(tc.env, tc.slots)
			switch {
			case tc.err != "":
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				return
			case err != nil:
				t.Fatal(err)
			case tc.want == "":
				if ok {
					t.Fatalf("an allocation %+v where there is none", a)
				}
				return
			case !ok:
				t.Fatal("no allocation found")
			}
			got := a.JobID + ":"
			for _, h := range a.Hosts {
				got += fmt.Sprintf(" %s:%d", h.Name, h.Slots)
			}
			if got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}
