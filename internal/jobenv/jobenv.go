// Package jobenv is the contract between whatever starts a worker (kolo run, mpirun or Slurm's
// srun) and the worker itself: the environment variable names, how a Job is written into an
// environment, and how a worker reads its Job back, from kolo run's variables or from those
// mpirun and srun set (launchers.go).
//
// It is pure: Encode and Decode work on plain maps so every launch mode is a table test. It must not
// start processes or open connections.
package jobenv

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/kolo-dl/kolo/internal/settings"
)

// Variable names, as package settings declares them. The HOROVOD_* spellings of the same values
// are also written so that existing scripts that read them keep working.
var (
	Rank       = settings.Rank.Name
	Size       = settings.Size.Name
	LocalRank  = settings.LocalRank.Name
	LocalSize  = settings.LocalSize.Name
	CrossRank  = settings.CrossRank.Name
	CrossSize  = settings.CrossSize.Name
	Hostname   = settings.Hostname.Name
	Rendezvous = settings.RendezvousAddr.Name
	JobID      = settings.JobID.Name
	Secret     = settings.Secret.Name // never on a command line: environment of a local exec or ssh stdin
	// NetworkInterface names the interface(s) whose address a worker listens on and advertises
	// (kolo run --network-interface); HorovodNetworkInterface is read when it is not set (Interface).
	NetworkInterface = settings.NetworkInterface.Name
	// HorovodNetworkInterface is Horovod's name for NetworkInterface.
	HorovodNetworkInterface = settings.NetworkInterface.Horovod[0]
	// HostCPUs is how many CPUs this machine gives its ranks, set by kolo run --bind-to core, whose
	// ranks each see only their own share in their affinity mask (HostCPUCount reads it).
	HostCPUs = settings.HostCPUs.Name
	// LauncherVersion is the version of the kolo run that started the worker; Init refuses to
	// join a job whose launcher speaks another version.
	LauncherVersion = settings.LauncherVersion.Name
)

// horovodNames are the contract's variables that Horovod's scripts read, by kolo's name.
var horovodNames = func() map[string]string {
	m := map[string]string{}
	for _, s := range []*settings.Setting{settings.Rank, settings.Size, settings.LocalRank, settings.LocalSize,
		settings.CrossRank, settings.CrossSize, settings.Hostname} {
		m[s.Name] = s.Horovod[0]
	}
	return m
}()

// Job is everything a worker needs to join its job, except the secret (read separately).
type Job struct {
	Rank, Size           int
	LocalRank, LocalSize int
	CrossRank, CrossSize int
	Hostname             string // groups ranks into hosts: ranks with the same Hostname share memory
	Rendezvous           string // host:port of the rendezvous store, or its Unix socket's path (a job on one host)
	JobID                string // unique per job; names shared-memory segments and guards against stale peers
}

// Single is the world of one process with no launcher: it needs no rendezvous.
func Single(hostname string) Job {
	return Job{Size: 1, LocalSize: 1, CrossSize: 1, Hostname: hostname}
}

// Encode returns the variables that describe j, with both KOLO_* and HOROVOD_* names.
func Encode(j Job) map[string]string {
	m := map[string]string{
		Rank:       strconv.Itoa(j.Rank),
		Size:       strconv.Itoa(j.Size),
		LocalRank:  strconv.Itoa(j.LocalRank),
		LocalSize:  strconv.Itoa(j.LocalSize),
		CrossRank:  strconv.Itoa(j.CrossRank),
		CrossSize:  strconv.Itoa(j.CrossSize),
		Hostname:   j.Hostname,
		Rendezvous: j.Rendezvous,
		JobID:      j.JobID,
	}
	for k, h := range horovodNames {
		m[h] = m[k]
	}
	return m
}

// Present reports whether env carries a kolo job (as opposed to a plain single process).
func Present(env map[string]string) bool {
	_, ok := env[Rendezvous]
	return ok
}

// Decode reads a Job written by Encode and checks it for consistency; errors name the variable.
func Decode(env map[string]string) (Job, error) {
	var j Job
	if err := readInts(env, []intVar{
		{Rank, &j.Rank}, {Size, &j.Size}, {LocalRank, &j.LocalRank}, {LocalSize, &j.LocalSize},
		{CrossRank, &j.CrossRank}, {CrossSize, &j.CrossSize},
	}); err != nil {
		if errors.Is(err, errUnset) {
			return Job{}, fmt.Errorf("environment: %w (is this process started by kolo run?)", err)
		}
		return Job{}, fmt.Errorf("environment: %w", err)
	}
	j.Hostname = env[Hostname]
	j.Rendezvous = env[Rendezvous]
	j.JobID = env[JobID]
	if err := j.Validate(); err != nil {
		return Job{}, fmt.Errorf("environment: %w", err)
	}
	return j, nil
}

// Validate checks that the numbers describe a possible placement and that a job of several ranks
// has somewhere to meet. A CrossSize of 0 means "not known yet" (see Detected).
func (j Job) Validate() error {
	if err := j.checkNumbers(); err != nil {
		return err
	}
	if j.Size > 1 && j.Rendezvous == "" {
		return fmt.Errorf("size %d but no rendezvous address (%s)", j.Size, Rendezvous)
	}
	return nil
}

func (j Job) checkNumbers() error {
	switch {
	case j.Size < 1:
		return fmt.Errorf("size %d < 1", j.Size)
	case j.Rank < 0 || j.Rank >= j.Size:
		return fmt.Errorf("rank %d outside [0, %d)", j.Rank, j.Size)
	case j.LocalSize < 1 || j.LocalSize > j.Size:
		return fmt.Errorf("local size %d outside [1, %d]", j.LocalSize, j.Size)
	case j.LocalRank < 0 || j.LocalRank >= j.LocalSize:
		return fmt.Errorf("local rank %d outside [0, %d)", j.LocalRank, j.LocalSize)
	case j.CrossSize < 0 || j.CrossSize > j.Size || j.CrossRank < 0 || (j.CrossSize > 0 && j.CrossRank >= j.CrossSize):
		return fmt.Errorf("cross rank %d / cross size %d inconsistent", j.CrossRank, j.CrossSize)
	case j.Hostname == "":
		return fmt.Errorf("no hostname (%s)", Hostname)
	}
	return nil
}

// FromEnviron converts os.Environ()-style "K=V" entries into a map.
func FromEnviron(environ []string) map[string]string {
	m := make(map[string]string, len(environ))
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	return m
}

// Interface is the network interface(s) a worker listens on and advertises (netif.InterfaceIP's
// "ib0,eth0"): KOLO_NETWORK_INTERFACE, else HOROVOD_GLOO_IFACE; "" when neither is set. name is the
// variable it came from, for messages.
func Interface(env map[string]string) (ifaces, name string) {
	k, v := settings.NetworkInterface.Lookup(settings.Env(env))
	return v, k
}

// Oversubscribe is kolo run's --oversubscribe as a setting of its environment: start more local
// ranks than this machine has CPUs. Read by kolo run, not by ranks.
var Oversubscribe = settings.Oversubscribe.Name

// Reports is the setting that turns the ranks' reports to kolo run (its live view, metrics and end
// table) off: 0 (or false, off, no). They are on when it is unset. A rank that fails still sends its
// failure record.
var Reports = settings.Reports.Name

// ReportsFrom reads Reports: whether the ranks report, on when unset.
func ReportsFrom(env map[string]string) (bool, error) {
	on, err := settings.Reports.Switch(settings.Env(env))
	if errors.Is(err, settings.ErrUnset) {
		return true, nil
	}
	return on, err
}
