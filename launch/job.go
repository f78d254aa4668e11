package launch

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strings"

	"github.com/kolo-dl/kolo/jobenv"
)

// LocalWorkers builds the Workers of a plan whose every rank runs on this machine: each gets the
// job contract, the secret and forwarded variables in its environment.
func LocalWorkers(slots []Slot, argv []string, rendezvous, jobID, secret string, extraEnv map[string]string, forward []string) ([]Worker, error) {
	base := os.Environ()
	ws := make([]Worker, len(slots))
	for i, s := range slots {
		if !IsLocal(s.Host) {
			return nil, fmt.Errorf("host %q is not this machine; launching on other hosts (ssh or --rendezvous) is not available yet", s.Host)
		}
		env := append([]string(nil), base...)
		for k, v := range jobenv.Encode(jobenv.Job{
			Rank: s.Rank, Size: s.Size, LocalRank: s.LocalRank, LocalSize: s.LocalSize,
			CrossRank: s.CrossRank, CrossSize: s.CrossSize, Hostname: s.Host,
			Rendezvous: rendezvous, JobID: jobID,
		}) {
			env = append(env, k+"="+v)
		}
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
		env = append(env, jobenv.Secret+"="+secret)
		ws[i] = Worker{Slot: s, Argv: argv, Env: env}
	}
	return ws, nil
}

// NewJobID returns a random identifier for one job.
func NewJobID() string {
	b := make([]byte, 8)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// RendezvousHost picks the address workers dial to reach the launcher's rendezvous: loopback when
// every rank is local.
func RendezvousHost(slots []Slot) string {
	for _, s := range slots {
		if !IsLocal(s.Host) {
			if hn, err := os.Hostname(); err == nil {
				return hn
			}
		}
	}
	return "127.0.0.1"
}
