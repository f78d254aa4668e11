package gpu

import (
	"errors"
	"fmt"
	"strings"

	"github.com/kolo-dl/kolo/internal/settings"
)

// Mode is what the user asked for: the device path when it can serve (Auto), never (Off), or
// always, failing the job rather than staging (On).
type Mode uint8

const (
	Auto Mode = iota
	Off
	On
)

func (m Mode) String() string { return [...]string{"auto", "off", "on"}[m] }

// Setting is Mode with the variable that chose it, so a log line can say why.
type Setting struct {
	Mode Mode
	From string // e.g. "KOLO_NCCL=0"; empty for the default
}

// ModeEnv is the variable that forces the device path off (0) or on (1) (settings.NCCL).
var ModeEnv = settings.NCCL.Name

// ParseMode reads KOLO_NCCL, then Horovod's HOROVOD_GPU_OPERATIONS and HOROVOD_GPU_ALLREDUCE (so
// existing job scripts keep their meaning): NCCL there means Auto, another library (MPI, GLOO,
// DDL) means Off, since kolo has no other device path. KOLO_NCCL wins over the Horovod names.
func ParseMode(getenv func(string) string) (Setting, error) {
	k, v := settings.NCCL.Lookup(getenv)
	if k == "" {
		return Setting{Auto, ""}, nil
	}
	from := k + "=" + v
	if k == settings.NCCL.Name {
		switch strings.ToLower(v) {
		case "0", "false", "off", "no":
			return Setting{Off, from}, nil
		case "1", "true", "on", "yes":
			return Setting{On, from}, nil
		case "auto":
			return Setting{Auto, from}, nil
		}
		return Setting{}, fmt.Errorf("%s: want 0, 1 or auto", from)
	}
	switch strings.ToUpper(v) {
	case "NCCL":
		return Setting{Auto, from}, nil
	case "MPI", "GLOO", "DDL", "CCL":
		return Setting{Off, from}, nil
	}
	return Setting{}, fmt.Errorf("%s: want NCCL, MPI or GLOO", from)
}

// Peer is what one rank reports about its device path, exchanged so that every rank decides
// alike from the same data.
type Peer struct {
	Host   string // the rank's host (ranks on one host may share a GPU)
	GPU    string // PCI bus id of its device, else its ordinal; empty if it has no device tensor
	HostID string // its NCCL_HOSTID
	// Problem is why its library cannot serve (Open's error text); empty when it can.
	Problem string
	NCCL    Version // the version its library reported, when Problem is empty
}

// Decision is the device path's verdict for a job.
type Decision struct {
	Use bool
	// Why is the reason for staging (nil when Use); it matches ErrUnavailable.
	Why error
}

// ErrForcedOn is matched by Decide's error when the user required the device path and it
// cannot serve.
var ErrForcedOn = errors.New("device path required but unavailable")

// Decide is the job-wide fallback rule, a pure function of every rank's Peer: the device path
// serves only if the user allows it, every rank's library loaded at MinNCCL or later, and no two
// ranks of one host use one GPU with the same NCCL_HOSTID (NCCL refuses duplicate GPUs; distinct
// NCCL_HOSTIDs make it treat them as separate hosts). Under On, a reason to stage is an error.
func Decide(s Setting, peers []Peer) (Decision, error) {
	why := reason(s, peers)
	if why == nil {
		return Decision{Use: true}, nil
	}
	why = fmt.Errorf("%w: %w", ErrUnavailable, why)
	if s.Mode == On {
		return Decision{Why: why}, fmt.Errorf("%s: %w: %w", s.From, ErrForcedOn, why)
	}
	return Decision{Why: why}, nil
}

func reason(s Setting, peers []Peer) error {
	if s.Mode == Off {
		return fmt.Errorf("turned off by %s", s.From)
	}
	for r, p := range peers {
		if p.Problem != "" {
			return fmt.Errorf("rank %d on %s: %s", r, p.Host, p.Problem)
		}
		if p.NCCL.Less(MinNCCL) {
			return fmt.Errorf("rank %d on %s: NCCL %s older than %d.%d (needs non-blocking communicators, ncclCommInitRankConfig)",
				r, p.Host, p.NCCL, MinNCCL.Major, MinNCCL.Minor)
		}
	}
	type slot struct{ host, gpu, hostID string }
	first := map[slot]int{}
	for r, p := range peers {
		if p.GPU == "" {
			continue
		}
		k := slot{p.Host, p.GPU, p.HostID}
		if q, ok := first[k]; ok {
			return fmt.Errorf("ranks %d and %d on %s share GPU %s with the same NCCL_HOSTID %q (give each rank its own GPU, or a distinct NCCL_HOSTID)",
				q, r, p.Host, p.GPU, p.HostID)
		}
		first[k] = r
	}
	return nil
}
