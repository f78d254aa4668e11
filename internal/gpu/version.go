package gpu

import "fmt"

// Version is a library version (NCCL's major.minor.patch).
type Version struct{ Major, Minor, Patch int }

func (v Version) String() string { return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch) }

// Less reports whether v is older than w.
func (v Version) Less(w Version) bool {
	if v.Major != w.Major {
		return v.Major < w.Major
	}
	if v.Minor != w.Minor {
		return v.Minor < w.Minor
	}
	return v.Patch < w.Patch
}

// NCCLVersion decodes ncclGetVersion's code. NCCL changed the encoding after 2.8
// (NCCL_VERSION in nccl.h): X*1000+Y*100+Z up to 2.8, X*10000+Y*100+Z from 2.9.
func NCCLVersion(code int) Version {
	if code >= 10000 {
		return Version{code / 10000, code / 100 % 100, code % 100}
	}
	return Version{code / 1000, code / 100 % 10, code % 100}
}

// Code is the inverse of NCCLVersion.
func (v Version) Code() int {
	if v.Major <= 2 && v.Minor <= 8 {
		return v.Major*1000 + v.Minor*100 + v.Patch
	}
	return v.Major*10000 + v.Minor*100 + v.Patch
}

// MinNCCL is the oldest NCCL kolo drives: 2.14 brought ncclCommInitRankConfig with non-blocking
// communicators (ncclInProgress), without which an abort cannot end a stuck collective.
var MinNCCL = Version{2, 14, 0}

// SplitNCCL is the first NCCL with ncclCommSplit; older ones form every sub-communicator from a
// fresh unique id.
var SplitNCCL = Version{2, 18, 0}
