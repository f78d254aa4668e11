package jobenv

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/kolo-dl/kolo/settings"
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
	// its place (kolo run --elastic-timeout); HorovodElasticTimeout is read when it is unset.
	ElasticTimeout        = settings.ElasticTimeout.Name
	HorovodElasticTimeout = settings.ElasticTimeout.Horovod[0]
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

// No-ssh mode (kolo run --rendezvous HOST:PORT): every node runs kolo run itself. The node serving
// the rendezvous runs the job (an elastic job's planner, or a static job's plan); every other node
// joins it as a host, starts and stops its own workers when the serving node orders it to, and
// reports how they ended. A static job is an elastic job whose hosts cannot change: a node leaving
// or falling silent ends it. Keys (J: the node's number, K: 1, 2, ... in order; every record is text):
//
//	elastic/nodes              counter: a joining node takes its number J (1, 2, ...)
//	elastic/node/J             the node's NodeJoin
//	elastic/node/J/welcome     the serving node's NodeWelcome: the node's host name, or a refusal
//	elastic/node/J/order/K     the serving node's K-th NodeOrder for node J, read in order
//	elastic/node/J/exit/K      node J's K-th NodeExit: one of its workers ended
//	elastic/node/J/beat        node J's heartbeat counter; a node silent too long has left
//	elastic/node/J/left        set by node J when it leaves the job (its kolo run was stopped): why
//	elastic/node/J/done        set by node J once it has read the end order
//
// The serving node is a host too, with no number: it starts its own workers without orders.
const NodesKey = "elastic/nodes"

// NodeKey is where node j registers (NodeJoin).
func NodeKey(j int) string { return "elastic/node/" + strconv.Itoa(j) }

// NodeWelcomeKey is where the serving node answers node j's registration (NodeWelcome).
func NodeWelcomeKey(j int) string { return NodeKey(j) + "/welcome" }

// NodeOrderKey is where the k-th order for node j is published (NodeOrder).
func NodeOrderKey(j, k int) string { return NodeKey(j) + "/order/" + strconv.Itoa(k) }

// NodeExitKey is where node j reports the k-th exit of its workers (NodeExit).
func NodeExitKey(j, k int) string { return NodeKey(j) + "/exit/" + strconv.Itoa(k) }

// NodeBeatKey is node j's heartbeat counter.
func NodeBeatKey(j int) string { return NodeKey(j) + "/beat" }

// NodeLeftKey is set by node j when it leaves the job; its value says why.
func NodeLeftKey(j int) string { return NodeKey(j) + "/left" }

// NodeDoneKey is set by node j once it has read the end order.
func NodeDoneKey(j int) string { return NodeKey(j) + "/done" }

// NodeOutcomeKey is where the serving node puts the job's outcome (kolo run --outcome-file's JSON
// document) before it sends the end orders, so that every node can write the same file.
const NodeOutcomeKey = "elastic/outcome"

// maxNodeRecord bounds what a node record decoder reads: a record is a few lines, a failed
// worker's stderr tail at most some kilobytes.
const maxNodeRecord = 1 << 20

// NodeJoin is what a node registers.
type NodeJoin struct {
	Hostname string // the node's host name (os.Hostname)
	Slots    int    // workers it can run (--nproc-per-node, -H localhost:N)
	Addr     string // the address it reaches the rendezvous from; "" when not known
	// Flags are the node's elastic flags in a canonical form: the serving node refuses a node
	// whose flags differ from its own.
	Flags string

	// A node of a static job says what the job's plan needs: the serving node refuses a node
	// that disagrees with it, or claims a node rank another node holds.
	Static   bool
	NNodes   int // --nnodes
	NP       int // -np given on that node; 0 if none
	NodeRank int // --node-rank; -1 if none
}

// Encode writes "join SLOTS HOSTNAME ADDR" (ADDR "-" when empty), for a static job followed by
// " static NNODES NP NODERANK" (NODERANK "-" when none), and the flags on the next line.
func (n NodeJoin) Encode() []byte {
	addr := n.Addr
	if addr == "" {
		addr = "-"
	}
	static := ""
	if n.Static {
		rank := "-"
		if n.NodeRank >= 0 {
			rank = strconv.Itoa(n.NodeRank)
		}
		static = fmt.Sprintf(" static %d %d %s", n.NNodes, n.NP, rank)
	}
	return fmt.Appendf(nil, "join %d %s %s%s\n%s", n.Slots, n.Hostname, addr, static, n.Flags)
}

// DecodeNodeJoin reads what NodeJoin.Encode wrote.
func DecodeNodeJoin(data []byte) (NodeJoin, error) {
	var n NodeJoin
	head, rest, err := splitRecord(data, "node registration")
	if err != nil {
		return n, err
	}
	f := strings.Fields(head)
	if (len(f) != 4 && !(len(f) == 8 && f[4] == "static")) || f[0] != "join" || !isWord(f[2]) || !isWord(f[3]) {
		return n, fmt.Errorf("node registration: bad header %q", head)
	}
	if n.Slots, err = strconv.Atoi(f[1]); err != nil || n.Slots < 1 {
		return n, fmt.Errorf("node registration: bad slot count %q", f[1])
	}
	n.Hostname = f[2]
	if f[3] != "-" {
		n.Addr = f[3]
	}
	n.NodeRank = -1
	if len(f) == 8 {
		n.Static = true
		n.NNodes, err = strconv.Atoi(f[5])
		if err != nil || n.NNodes < 1 {
			return n, fmt.Errorf("node registration: bad node count %q", f[5])
		}
		if n.NP, err = strconv.Atoi(f[6]); err != nil || n.NP < 0 {
			return n, fmt.Errorf("node registration: bad -np %q", f[6])
		}
		if f[7] != "-" {
			if n.NodeRank, err = strconv.Atoi(f[7]); err != nil || n.NodeRank < 0 {
				return n, fmt.Errorf("node registration: bad node rank %q", f[7])
			}
		}
	}
	n.Flags = strings.TrimSpace(rest)
	return n, nil
}

// NodeWelcome is the serving node's answer to a node's registration.
type NodeWelcome struct {
	Host    string        // the host the node's workers are in: its host name, made unique in the job
	JobID   string        // the job id its workers get (KOLO_JOB_ID)
	Timeout time.Duration // the elastic timeout its workers get (KOLO_ELASTIC_TIMEOUT)
	Static  bool          // a static job: its workers get the static contract, and no timeout
	Refused string        // non-empty: the node is not in the job, and why
}

// Encode writes "welcome HOST JOBID SECONDS" ("static" for SECONDS in a static job), or
// "refused" and the reason on the lines after it.
func (w NodeWelcome) Encode() []byte {
	if w.Refused != "" {
		return fmt.Appendf(nil, "refused\n%s", w.Refused)
	}
	timeout := "static"
	if !w.Static {
		timeout = strconv.FormatFloat(w.Timeout.Seconds(), 'f', -1, 64)
	}
	return fmt.Appendf(nil, "welcome %s %s %s\n", w.Host, w.JobID, timeout)
}

// DecodeNodeWelcome reads what NodeWelcome.Encode wrote.
func DecodeNodeWelcome(data []byte) (NodeWelcome, error) {
	var w NodeWelcome
	head, rest, err := splitRecord(data, "node welcome")
	if err != nil {
		return w, err
	}
	f := strings.Fields(head)
	if len(f) == 1 && f[0] == "refused" {
		w.Refused = strings.TrimSpace(rest)
		if w.Refused == "" {
			w.Refused = "refused by the serving node"
		}
		return w, nil
	}
	if len(f) != 4 || f[0] != "welcome" || !isWord(f[1]) || !isWord(f[2]) {
		return w, fmt.Errorf("node welcome: bad header %q", head)
	}
	if f[3] == "static" {
		w.Host, w.JobID, w.Static = f[1], f[2], true
		return w, nil
	}
	s, err := strconv.ParseFloat(f[3], 64)
	if err != nil || !(s > 0 && s < 1e9) {
		return w, fmt.Errorf("node welcome: bad timeout %q", f[3])
	}
	w.Host, w.JobID, w.Timeout = f[1], f[2], time.Duration(s*float64(time.Second))
	return w, nil
}

// OrderKind is what a NodeOrder asks of a node.
type OrderKind int

const (
	OrderStart OrderKind = iota + 1 // start a worker at one of the node's slots
	OrderStop                       // send one of its workers a signal
	OrderEnd                        // the job has ended: stop every worker, report, exit
)

// NodeOrder is an order of the serving node to a node. A worker is named by the number K of the
// order that started it (NodeOrderKey(j, K)).
type NodeOrder struct {
	Kind   OrderKind
	Worker int // OrderStart, OrderStop: the worker

	// OrderStart: its slot on the node, the round it is started for (0 in a static job, which has
	// no rounds) and its numbers in that round.
	Slot, Round                      int
	Rank, Size, LocalRank, LocalSize int
	CrossRank, CrossSize             int

	Signal int // OrderStop

	// OrderEnd: the job's exit code, which every node exits with, and what to print (the reason
	// it failed and the summary; empty when it succeeded).
	Code   int
	Reason string
}

// Encode writes one of
//
//	start WORKER SLOT ROUND RANK SIZE LOCALRANK LOCALSIZE CROSSRANK CROSSSIZE
//	stop WORKER SIGNAL
//	end CODE            (and the reason on the lines after it)
func (o NodeOrder) Encode() []byte {
	switch o.Kind {
	case OrderStart:
		return fmt.Appendf(nil, "start %d %d %d %d %d %d %d %d %d\n", o.Worker, o.Slot, o.Round,
			o.Rank, o.Size, o.LocalRank, o.LocalSize, o.CrossRank, o.CrossSize)
	case OrderStop:
		return fmt.Appendf(nil, "stop %d %d\n", o.Worker, o.Signal)
	}
	return fmt.Appendf(nil, "end %d\n%s", o.Code, o.Reason)
}

// DecodeNodeOrder reads what NodeOrder.Encode wrote and checks it: a worker number of 1 or more,
// a rank placement that is possible, a signal number of 1..64, an exit code of 0..255.
func DecodeNodeOrder(data []byte) (NodeOrder, error) {
	var o NodeOrder
	head, rest, err := splitRecord(data, "node order")
	if err != nil {
		return o, err
	}
	f := strings.Fields(head)
	if len(f) == 0 {
		return o, errors.New("node order: empty header")
	}
	nums := make([]int, len(f)-1)
	for i, s := range f[1:] {
		if nums[i], err = strconv.Atoi(s); err != nil {
			return o, fmt.Errorf("node order: bad number in %q", head)
		}
	}
	switch {
	case f[0] == "start" && len(nums) == 9:
		o = NodeOrder{Kind: OrderStart, Worker: nums[0], Slot: nums[1], Round: nums[2], Rank: nums[3], Size: nums[4],
			LocalRank: nums[5], LocalSize: nums[6], CrossRank: nums[7], CrossSize: nums[8]}
		j := Job{Rank: o.Rank, Size: o.Size, LocalRank: o.LocalRank, LocalSize: o.LocalSize,
			CrossRank: o.CrossRank, CrossSize: o.CrossSize, Hostname: "-"}
		switch err := j.checkNumbers(); {
		case o.Worker < 1 || o.Slot < 0 || o.Round < 0:
			return o, fmt.Errorf("node order: bad worker, slot or round in %q", head)
		case err != nil:
			return o, fmt.Errorf("node order %q: %w", head, err)
		}
	case f[0] == "stop" && len(nums) == 2:
		o = NodeOrder{Kind: OrderStop, Worker: nums[0], Signal: nums[1]}
		if o.Worker < 1 || o.Signal < 1 || o.Signal > 64 {
			return o, fmt.Errorf("node order: bad worker or signal in %q", head)
		}
	case f[0] == "end" && len(nums) == 1:
		o = NodeOrder{Kind: OrderEnd, Code: nums[0], Reason: strings.TrimRight(rest, "\n")}
		if o.Code < 0 || o.Code > 255 {
			return o, fmt.Errorf("node order: bad exit code in %q", head)
		}
	default:
		return o, fmt.Errorf("node order: bad header %q", head)
	}
	return o, nil
}

// NodeExit is a node's report that one of its workers ended.
type NodeExit struct {
	Worker  int    // the worker: the number of the order that started it
	Code    int    // its exit code; -1 when killed by a signal or never started
	Signal  int    // the signal that killed it, 0 if none
	Err     string // it could not be started or waited for
	Leaving bool   // the node stopped it because the node is leaving the job
	Tail    []string
}

// Encode writes "exit WORKER CODE SIGNAL" (and " leaving"), then "err TEXT" when there is an
// error and a "tail LINE" line for each of the last lines of its stderr.
func (e NodeExit) Encode() []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "exit %d %d %d", e.Worker, e.Code, e.Signal)
	if e.Leaving {
		b.WriteString(" leaving")
	}
	b.WriteByte('\n')
	if e.Err != "" {
		fmt.Fprintf(&b, "err %s\n", oneLine(e.Err))
	}
	for _, l := range e.Tail {
		fmt.Fprintf(&b, "tail %s\n", oneLine(l))
	}
	return b.Bytes()
}

// DecodeNodeExit reads what NodeExit.Encode wrote.
func DecodeNodeExit(data []byte) (NodeExit, error) {
	var e NodeExit
	head, rest, err := splitRecord(data, "worker exit")
	if err != nil {
		return e, err
	}
	f := strings.Fields(head)
	if (len(f) != 4 && !(len(f) == 5 && f[4] == "leaving")) || f[0] != "exit" {
		return e, fmt.Errorf("worker exit: bad header %q", head)
	}
	nums := make([]int, 3)
	for i, s := range f[1:4] {
		if nums[i], err = strconv.Atoi(s); err != nil {
			return e, fmt.Errorf("worker exit: bad number in %q", head)
		}
	}
	e = NodeExit{Worker: nums[0], Code: nums[1], Signal: nums[2], Leaving: len(f) == 5}
	if e.Worker < 1 || e.Code < -1 || e.Code > 255 || e.Signal < 0 || e.Signal > 64 {
		return e, fmt.Errorf("worker exit: bad worker, code or signal in %q", head)
	}
	for _, line := range strings.Split(rest, "\n") {
		switch k, v, _ := strings.Cut(line, " "); k {
		case "":
		case "err":
			e.Err = v
		case "tail":
			e.Tail = append(e.Tail, v)
		default:
			return e, fmt.Errorf("worker exit %d: bad line %q", e.Worker, line)
		}
	}
	return e, nil
}

// splitRecord splits a node record into its first line and the rest.
func splitRecord(data []byte, what string) (head, rest string, err error) {
	if len(data) == 0 {
		return "", "", fmt.Errorf("%s: empty record", what)
	}
	if len(data) > maxNodeRecord {
		return "", "", fmt.Errorf("%s: %d bytes, more than %d", what, len(data), maxNodeRecord)
	}
	h, r, _ := strings.Cut(string(data), "\n")
	return h, r, nil
}

// isWord reports whether s can stand as one field of a record: not empty, no space, printable.
func isWord(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r <= ' ' || r == 0x7f {
			return false
		}
	}
	return true
}

// oneLine keeps s on one line of a record.
func oneLine(s string) string { return strings.NewReplacer("\r", " ", "\n", " ").Replace(s) }
