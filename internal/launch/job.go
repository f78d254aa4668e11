package launch

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"strings"

	"github.com/kolo-dl/kolo/internal/jobenv"
	"github.com/kolo-dl/kolo/internal/launch/layout"
	"github.com/kolo-dl/kolo/internal/version"
)

// WorkerEnv is the environment of one rank: the launcher's own environment, the job contract of
// slot, extraEnv, the forwarded variables (-x NAME or NAME=VALUE) and, last, the secret.
func WorkerEnv(s layout.Slot, rendezvous, jobID, secret string, extraEnv map[string]string, forward []string) []string {
	env := os.Environ()
	for k, v := range jobenv.Encode(jobenv.Job{
		Rank: s.Rank, Size: s.Size, LocalRank: s.LocalRank, LocalSize: s.LocalSize,
		CrossRank: s.CrossRank, CrossSize: s.CrossSize, Hostname: s.Host,
		Rendezvous: rendezvous, JobID: jobID,
	}) {
		env = append(env, k+"="+v)
	}
	env = append(env, jobenv.LauncherVersion+"="+version.Version)
	for k, v := range extraEnv {
		env = append(env, k+"="+v)
	}
	for _, x := range forward {
		if strings.Contains(x, "=") {
			env = append(env, x)
		} else if v, ok := os.LookupEnv(x); ok {
			env = append(env, x+"="+v)
		}
	}
	return append(env, jobenv.Secret+"="+secret)
}

// NewJobID returns a random identifier for one job.
func NewJobID() string {
	b := make([]byte, 8)
	rand.Read(b)
	return hex.EncodeToString(b)
}
