package jobenv

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/kolo-dl/kolo/internal/settings"
)

// Elastic mode's contract (kolo run --min-np/--max-np/--host-discovery-script).
//
// A worker of an elastic job is known by its place, a host and a slot on it, and keeps that
// place while its rank changes. The launcher publishes each world of the job as a Round at the
// rendezvous (RoundKey); a worker joins a round by finding its place there, and every rank of
// the round meets under a job id of the round's own (Round.JobID), so nothing of an earlier
// world is ever read. Rounds are numbered 1, 2, ... in the order published: a new round follows
// every change the launcher's planner decides (a generation), and also a re-forming of the same
// workers after an error that killed nobody (every worker of the round asked for one at
// ReinitKey). The last round may be an end record (Round.End): the job failed, and a worker
// waiting for a round gets the reason instead of waiting out its timeout.
var (
	Elastic      = settings.Elastic.Name      // "1" in every worker of an elastic job
	ElasticHost  = settings.ElasticHost.Name  // the worker's host, as the discovery names it
	ElasticSlot  = settings.ElasticSlot.Name  // the worker's slot on that host, 0-based
	ElasticRound = settings.ElasticRound.Name // the round the worker was started for
	// ElasticTimeout is how long (seconds) a worker waits at the rendezvous for a round that has
	// its place (kolo run --elastic-timeout); its Horovod name is read when it is unset.
	ElasticTimeout = settings.ElasticTimeout.Name
)

// DefaultElasticTimeout is Horovod's default elastic timeout.
const DefaultElasticTimeout = 600 * time.Second

// LatestRoundKey holds the number of the newest round published (decimal text).
const LatestRoundKey = "elastic/latest"

// RoundKey is where round n is published (Round.Encode).
func RoundKey(n int) string { return "elastic/round/" + strconv.Itoa(n) }

// ReinitKey is set by the worker at p when it leaves round n on an error and waits for the next
// round. When every live worker of the round has asked and nobody was lost, the launcher
// publishes the same workers as a new round; workers that have not asked a while after others
// did are stuck, and the launcher stops them as failed.
func ReinitKey(n int, p Place) string { return RoundKey(n) + "/reinit/" + p.String() }

// LeftKey is set by the worker at p when it leaves round n without an error (to join the next
// one, or at the end of training), before it closes its connections; one that leaves on an error
// sets ReinitKey instead, also before. A peer whose call fails on those connections names the
// worker to the launcher (EncodeReinit), which stops a named worker at once only if it has set
// neither: one that left on purpose is not stuck.
func LeftKey(n int, p Place) string { return RoundKey(n) + "/left/" + p.String() }

// JoinedKey is set by the worker at p once it has joined round n (its connections are made).
// The launcher reads it when the job ends: a worker that exits 0 finished training in the last
// round it joined, and workers started for a later round, which can never form without it, are
// stopped rather than left waiting.
func JoinedKey(n int, p Place) string { return RoundKey(n) + "/joined/" + p.String() }

// AliveKey is the worker at p's presence record: it sets it, as a session record of its
// rendezvous connection (rendezvous.Client.SetSession), before it sets its JoinedKey, and keeps
// that connection open until its next round's record replaces it. The record disappears only
// when the connection does: the process died, or its host stopped answering (the launcher's
// rendezvous gives up on it after transport.DeadHostTimeout). A worker of the current round that
// joined, has not asked for the next one and has no record can no longer be reached: the
// launcher stops it at once instead of waiting for it.
func AliveKey(p Place) string { return "elastic/alive/" + p.String() }

// EncodeReinit is the value a worker sets at its ReinitKey: the places of the workers its
// engine found stuck or lost (one "suspect HOST SLOT" line each; none: it does not know). The
// launcher stops a suspect that has not asked for the next round at once, rather than after its
// grace: a worker cut off from the others, or stopped, would never ask.
func EncodeReinit(suspects []Place) []byte {
	var b bytes.Buffer
	for _, p := range suspects {
		fmt.Fprintf(&b, "suspect %s %d\n", p.Host, p.Slot)
	}
	return b.Bytes()
}

// DecodeReinit reads what EncodeReinit wrote. An empty value (or "1", what workers of earlier
// kolo versions set) names nobody.
func DecodeReinit(data []byte) ([]Place, error) {
	var out []Place
	text := strings.TrimSpace(string(data))
	if text == "" || text == "1" {
		return nil, nil
	}
	for _, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		if len(f) != 3 || f[0] != "suspect" {
			return nil, fmt.Errorf("elastic reinit: bad line %q", line)
		}
		slot, err := strconv.Atoi(f[2])
		if err != nil || slot < 0 {
			return nil, fmt.Errorf("elastic reinit: bad slot in %q", line)
		}
		out = append(out, Place{Host: f[1], Slot: slot})
	}
	return out, nil
}

// Place is a worker's identity in an elastic job: a host and a slot on it.
type Place struct {
	Host string
	Slot int
}

func (p Place) String() string { return fmt.Sprintf("%s[%d]", p.Host, p.Slot) }

// RoundRank is one rank of a round: the worker at Place, and its local and cross numbers.
type RoundRank struct {
	Place
	LocalRank, LocalSize int
	CrossRank, CrossSize int
}

// Round is one world of an elastic job, as the launcher publishes it.
type Round struct {
	Number     int         // 1, 2, ...
	Generation int         // the launcher planner's generation it lays out
	Ranks      []RoundRank // by rank
	End        string      // non-empty: the job ended with this reason, and no round follows
}

// Encode writes r as text: a header line, then a line per rank.
//
//	round 3 generation 2 size 2
//	rank 0 host-a 0 0 1 0 2
//	rank 1 host-b 1 0 1 1 2
//
// or, for an end record, "round 4 end" and the reason on the lines after it.
func (r Round) Encode() []byte {
	var b bytes.Buffer
	if r.End != "" {
		fmt.Fprintf(&b, "round %d end\n%s", r.Number, r.End)
		return b.Bytes()
	}
	fmt.Fprintf(&b, "round %d generation %d size %d\n", r.Number, r.Generation, len(r.Ranks))
	for i, k := range r.Ranks {
		fmt.Fprintf(&b, "rank %d %s %d %d %d %d %d\n", i, k.Host, k.Slot, k.LocalRank, k.LocalSize, k.CrossRank, k.CrossSize)
	}
	return b.Bytes()
}

// DecodeRound reads what Encode wrote and checks it: every rank's numbers must describe a
// possible placement, and no place may appear twice. Errors say which line is wrong.
func DecodeRound(data []byte) (Round, error) {
	var r Round
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, len(data)+1)
	if !sc.Scan() {
		return r, errors.New("elastic round: empty record")
	}
	head := strings.Fields(sc.Text())
	if len(head) == 3 && head[0] == "round" && head[2] == "end" {
		n, err := strconv.Atoi(head[1])
		if err != nil || n < 1 {
			return r, fmt.Errorf("elastic round: bad header %q", sc.Text())
		}
		r.Number = n
		_, reason, _ := bytes.Cut(data, []byte("\n"))
		r.End = strings.TrimSpace(string(reason))
		if r.End == "" {
			r.End = "the job ended"
		}
		return r, nil
	}
	var size int
	if len(head) != 6 || head[0] != "round" || head[2] != "generation" || head[4] != "size" {
		return r, fmt.Errorf("elastic round: bad header %q", sc.Text())
	}
	for i, dst := range []*int{&r.Number, &r.Generation, &size} {
		n, err := strconv.Atoi(head[1+2*i])
		if err != nil || n < 1 {
			return r, fmt.Errorf("elastic round: bad header %q", sc.Text())
		}
		*dst = n
	}
	seen := map[Place]bool{}
	for sc.Scan() {
		line := sc.Text()
		f := strings.Fields(line)
		if len(f) != 8 || f[0] != "rank" {
			return r, fmt.Errorf("elastic round %d: bad rank line %q", r.Number, line)
		}
		nums := make([]int, 6)
		for i, s := range append(f[1:2:2], f[3:]...) {
			n, err := strconv.Atoi(s)
			if err != nil {
				return r, fmt.Errorf("elastic round %d: bad rank line %q", r.Number, line)
			}
			nums[i] = n
		}
		k := RoundRank{Place: Place{Host: f[2], Slot: nums[1]}, LocalRank: nums[2], LocalSize: nums[3], CrossRank: nums[4], CrossSize: nums[5]}
		j := Job{Rank: nums[0], Size: size, LocalRank: k.LocalRank, LocalSize: k.LocalSize,
			CrossRank: k.CrossRank, CrossSize: k.CrossSize, Hostname: k.Host}
		switch err := j.checkNumbers(); {
		case nums[0] != len(r.Ranks):
			return r, fmt.Errorf("elastic round %d: rank line %q out of order", r.Number, line)
		case k.Slot < 0:
			return r, fmt.Errorf("elastic round %d: negative slot in %q", r.Number, line)
		case err != nil:
			return r, fmt.Errorf("elastic round %d: rank %d: %w", r.Number, nums[0], err)
		case seen[k.Place]:
			return r, fmt.Errorf("elastic round %d: %s has two ranks", r.Number, k.Place)
		}
		seen[k.Place] = true
		r.Ranks = append(r.Ranks, k)
	}
	if len(r.Ranks) != size {
		return r, fmt.Errorf("elastic round %d: header says size %d, %d rank lines follow", r.Number, size, len(r.Ranks))
	}
	return r, nil
}

// JobID is the job id the ranks of round r meet under: the launcher's job id and the round's
// number, so that shared memory and rendezvous records of one round are never those of another.
func (r Round) JobID(base string) string { return fmt.Sprintf("%s.r%d", base, r.Number) }

// Job returns the Job of the worker at p in round r (base gives the rendezvous and the job id),
// and false when r has no rank at p.
func (r Round) Job(p Place, base Job) (Job, bool) {
	for i, k := range r.Ranks {
		if k.Place == p {
			return Job{Rank: i, Size: len(r.Ranks), LocalRank: k.LocalRank, LocalSize: k.LocalSize,
				CrossRank: k.CrossRank, CrossSize: k.CrossSize, Hostname: p.Host,
				Rendezvous: base.Rendezvous, JobID: r.JobID(base.JobID)}, true
		}
	}
	return Job{}, false
}

// ElasticPlace reads the place of a worker of an elastic job from env; ok is false when env is
// not an elastic worker's (KOLO_ELASTIC unset). round is the round it was started for.
func ElasticPlace(env map[string]string) (p Place, round int, ok bool, err error) {
	if env[Elastic] != "1" {
		return Place{}, 0, false, nil
	}
	p.Host = env[ElasticHost]
	if p.Host == "" {
		return p, 0, true, fmt.Errorf("environment: %s=1 but %s is not set", Elastic, ElasticHost)
	}
	if p.Slot, err = strconv.Atoi(env[ElasticSlot]); err != nil || p.Slot < 0 {
		return p, 0, true, fmt.Errorf("environment: %s=%q is not a slot number", ElasticSlot, env[ElasticSlot])
	}
	if round, err = strconv.Atoi(env[ElasticRound]); err != nil || round < 1 {
		return p, 0, true, fmt.Errorf("environment: %s=%q is not a round number", ElasticRound, env[ElasticRound])
	}
	return p, round, true, nil
}

// ElasticTimeoutFrom reads the elastic timeout: KOLO_ELASTIC_TIMEOUT, else HOROVOD_ELASTIC_TIMEOUT
// (seconds), else DefaultElasticTimeout.
func ElasticTimeoutFrom(env map[string]string) (time.Duration, error) {
	d, err := settings.ElasticTimeout.Seconds(settings.Env(env))
	switch {
	case errors.Is(err, settings.ErrUnset):
		return DefaultElasticTimeout, nil
	case err != nil:
		return 0, fmt.Errorf("environment: %w", err)
	}
	return d, nil
}
