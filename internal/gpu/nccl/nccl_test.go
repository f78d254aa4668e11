package nccl

import (
	"errors"
	"strings"
	"testing"
	"unsafe"

	"github.com/kolo-dl/kolo/internal/gpu"
)

// configMirror is ncclConfig_v21700 as nccl.h declares it (NCCL 2.17 to 2.28 keep this prefix).
type configMirror struct {
	size           uintptr
	magic, version uint32
	blocking       int32
	cgaClusterSize int32
	minCTAs        int32
	maxCTAs        int32
	netName        *byte
	splitShare     int32
}

func TestConfigLayoutMatchesHeader(t *testing.T) {
	var c configMirror
	for _, tc := range []struct {
		name      string
		got, want uintptr
	}{
		{"sizeof", unsafe.Sizeof(c), configSize},
		{"magic", unsafe.Offsetof(c.magic), configOffMagic},
		{"version", unsafe.Offsetof(c.version), configOffVersion},
		{"blocking", unsafe.Offsetof(c.blocking), configOffBlocking},
		{"cgaClusterSize", unsafe.Offsetof(c.cgaClusterSize), configOffCGACluster},
		{"minCTAs", unsafe.Offsetof(c.minCTAs), configOffMinCTAs},
		{"maxCTAs", unsafe.Offsetof(c.maxCTAs), configOffMaxCTAs},
		{"netName", unsafe.Offsetof(c.netName), configOffNetName},
		{"splitShare", unsafe.Offsetof(c.splitShare), configOffSplitShare},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, tc.got, tc.want)
		}
	}
	if got := (gpu.Version{Major: 2, Minor: 17}).Code(); got != configVersion {
		t.Errorf("config version %d, NCCL_VERSION(2,17,0) is %d", configVersion, got)
	}
	if configUndefInt != -1<<31 {
		t.Errorf("NCCL_CONFIG_UNDEF_INT is INT_MIN")
	}
}

func TestCheckVersion(t *testing.T) {
	for _, tc := range []struct {
		code    int
		want    gpu.Version
		tooOld  bool
		message string
	}{
		{2708, gpu.Version{Major: 2, Minor: 7, Patch: 8}, true, "NCCL 2.7.8, older than 2.14"},
		{21212, gpu.Version{Major: 2, Minor: 12, Patch: 12}, true, "NCCL 2.12.12, older than 2.14 (needs non-blocking communicators"},
		{21403, gpu.Version{Major: 2, Minor: 14, Patch: 3}, false, ""},
		{22809, gpu.Version{Major: 2, Minor: 28, Patch: 9}, false, ""},
		{30001, gpu.Version{Major: 3, Minor: 0, Patch: 1}, false, ""},
	} {
		v, err := checkVersion("libnccl.so.2", tc.code)
		if v != tc.want {
			t.Errorf("code %d: version %v, want %v", tc.code, v, tc.want)
		}
		if tc.tooOld != errors.Is(err, ErrTooOld) || (tc.tooOld && !errors.Is(err, gpu.ErrUnavailable)) {
			t.Errorf("code %d: error %v, too old %v", tc.code, err, tc.tooOld)
		}
		if tc.tooOld && !strings.Contains(err.Error(), tc.message) {
			t.Errorf("code %d: %q lacks %q", tc.code, err, tc.message)
		}
	}
}

func TestResultErrorText(t *testing.T) {
	for _, tc := range []struct {
		err  ResultError
		want string
	}{
		{ResultError{Call: "ncclAllReduce", Code: resRemoteError, Detail: "peer gone"}, "ncclAllReduce: ncclRemoteError: peer gone"},
		{ResultError{Call: "ncclCommInitRankConfig", Code: resInProgress}, "ncclCommInitRankConfig: ncclInProgress"},
		{ResultError{Call: "x", Code: 42}, "x: ncclResult 42"},
	} {
		if got := tc.err.Error(); got != tc.want {
			t.Errorf("%q, want %q", got, tc.want)
		}
	}
}
