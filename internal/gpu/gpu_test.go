package gpu

import (
	"errors"
	"strings"
	"testing"

	"github.com/kolo-dl/kolo/internal/dtype"
)

func env(kv ...string) func(string) string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) string { return m[k] }
}

func TestParseMode(t *testing.T) {
	for _, tc := range []struct {
		env     func(string) string
		want    Setting
		wantErr bool
	}{
		{env(), Setting{Auto, ""}, false},
		{env("KOLO_NCCL", "0"), Setting{Off, "KOLO_NCCL=0"}, false},
		{env("KOLO_NCCL", "off"), Setting{Off, "KOLO_NCCL=off"}, false},
		{env("KOLO_NCCL", "1"), Setting{On, "KOLO_NCCL=1"}, false},
		{env("KOLO_NCCL", "auto"), Setting{Auto, "KOLO_NCCL=auto"}, false},
		{env("KOLO_NCCL", "maybe"), Setting{}, true},
		{env("HOROVOD_GPU_OPERATIONS", "NCCL"), Setting{Auto, "HOROVOD_GPU_OPERATIONS=NCCL"}, false},
		{env("HOROVOD_GPU_ALLREDUCE", "nccl"), Setting{Auto, "HOROVOD_GPU_ALLREDUCE=nccl"}, false},
		{env("HOROVOD_GPU_ALLREDUCE", "MPI"), Setting{Off, "HOROVOD_GPU_ALLREDUCE=MPI"}, false},
		{env("HOROVOD_GPU_OPERATIONS", "GLOO", "HOROVOD_GPU_ALLREDUCE", "NCCL"), Setting{Off, "HOROVOD_GPU_OPERATIONS=GLOO"}, false},
		{env("HOROVOD_GPU_ALLREDUCE", "RCCL"), Setting{}, true},
		{env("KOLO_NCCL", "1", "HOROVOD_GPU_ALLREDUCE", "MPI"), Setting{On, "KOLO_NCCL=1"}, false},
	} {
		got, err := ParseMode(tc.env)
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("%+v: got %+v, %v", tc.want, got, err)
		}
	}
}

func TestDecide(t *testing.T) {
	v := Version{2, 21, 5}
	gpu := func(host, bus, hostID string) Peer { return Peer{Host: host, GPU: bus, HostID: hostID, NCCL: v} }
	auto := Setting{Auto, ""}
	for _, tc := range []struct {
		name    string
		s       Setting
		peers   []Peer
		use     bool
		why     string // in the reason to stage
		errWant bool
	}{
		{"one GPU per rank", auto, []Peer{gpu("a", "0000:3b:00.0", ""), gpu("a", "0000:5e:00.0", ""), gpu("b", "0000:3b:00.0", "")}, true, "", false},
		{"forced off", Setting{Off, "KOLO_NCCL=0"}, []Peer{gpu("a", "0", "")}, false, "turned off by KOLO_NCCL=0", false},
		{"horovod's MPI", Setting{Off, "HOROVOD_GPU_ALLREDUCE=MPI"}, []Peer{gpu("a", "0", "")}, false, "HOROVOD_GPU_ALLREDUCE=MPI", false},
		{"no libnccl on one rank", auto, []Peer{gpu("a", "0", ""), {Host: "b", GPU: "0", Problem: "libnccl.so.2 not found"}}, false, "rank 1 on b: libnccl.so.2 not found", false},
		{"too old", auto, []Peer{gpu("a", "0", ""), {Host: "a", GPU: "1", NCCL: Version{2, 12, 12}}}, false, "NCCL 2.12.12 older than 2.14", false},
		{"two ranks on one GPU", auto, []Peer{gpu("a", "0000:3b:00.0", ""), gpu("a", "0000:3b:00.0", "")}, false, "ranks 0 and 1 on a share GPU 0000:3b:00.0", false},
		{"one GPU, distinct NCCL_HOSTID", auto, []Peer{gpu("a", "0000:3b:00.0", "h0"), gpu("a", "0000:3b:00.0", "h1")}, true, "", false},
		{"one GPU, same NCCL_HOSTID", auto, []Peer{gpu("a", "0000:3b:00.0", "h"), gpu("a", "0000:3b:00.0", "h")}, false, "same NCCL_HOSTID", false},
		{"same bus id on two hosts", auto, []Peer{gpu("a", "0000:3b:00.0", ""), gpu("b", "0000:3b:00.0", "")}, true, "", false},
		{"forced on, fine", Setting{On, "KOLO_NCCL=1"}, []Peer{gpu("a", "0", "")}, true, "", false},
		{"forced on, unavailable", Setting{On, "KOLO_NCCL=1"}, []Peer{{Host: "a", Problem: "built without cgo: NCCL unavailable"}}, false, "built without cgo", true},
		{"no ranks", auto, nil, true, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := Decide(tc.s, tc.peers)
			if d.Use != tc.use {
				t.Fatalf("Use = %v, want %v (why: %v)", d.Use, tc.use, d.Why)
			}
			if tc.use != (d.Why == nil) {
				t.Fatalf("Why = %v with Use %v", d.Why, d.Use)
			}
			if !tc.use && (!errors.Is(d.Why, ErrUnavailable) || !strings.Contains(d.Why.Error(), tc.why)) {
				t.Fatalf("Why = %q, want ErrUnavailable saying %q", d.Why, tc.why)
			}
			if (err != nil) != tc.errWant || (err != nil && !errors.Is(err, ErrForcedOn)) {
				t.Fatalf("err = %v, want error %v", err, tc.errWant)
			}
		})
	}
}

func TestNCCLVersion(t *testing.T) {
	for _, tc := range []struct {
		code int
		v    Version
	}{
		{2708, Version{2, 7, 8}},
		{2804, Version{2, 8, 4}},
		{20903, Version{2, 9, 3}},
		{21403, Version{2, 14, 3}},
		{22809, Version{2, 28, 9}},
		{30100, Version{3, 1, 0}},
	} {
		if got := NCCLVersion(tc.code); got != tc.v {
			t.Errorf("NCCLVersion(%d) = %v, want %v", tc.code, got, tc.v)
		}
		if got := tc.v.Code(); got != tc.code {
			t.Errorf("%v.Code() = %d, want %d", tc.v, got, tc.code)
		}
	}
	if !(Version{2, 12, 12}).Less(MinNCCL) || MinNCCL.Less(Version{2, 14, 0}) || !(Version{2, 17, 9}).Less(SplitNCCL) {
		t.Error("version order")
	}
}

func TestDataTypes(t *testing.T) {
	for _, d := range dtype.All {
		g, err := FromDType(d)
		if d == dtype.Int16 {
			if !errors.Is(err, ErrUnavailable) {
				t.Errorf("int16: %v, want unavailable", err)
			}
			continue
		}
		if err != nil || g.Size() != d.Size() || g.String() != d.String() {
			t.Errorf("%s -> %s (%d bytes), %v", d, g, g.Size(), err)
		}
	}
	if len(DataTypes) != 10 || DataType(10).Size() != 0 {
		t.Error("NCCL has ten data types")
	}
}
