package launch

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/kolo-dl/kolo/internal/jobenv"
)

// The no-ssh node protocol's keys and records (node.go has the protocol). Keys (J: the node's
// number, K: 1, 2, ... in order; every record is text):
//
//	elastic/nodes              counter: a joining node takes its number J (1, 2, ...)
//	elastic/node/J             the node's NodeJoin
//	elastic/node/J/welcome     the serving node's NodeWelcome: the node's host name, or a refusal
//	elastic/node/J/order/K     the serving node's K-th NodeOrder for node J, read in order
//	elastic/node/J/exit/K      node J's K-th NodeExit: one of its workers ended
//	elastic/node/J/beat        node J's heartbeat counter; a node silent too long has left
//	elastic/node/J/left        set by node J when it leaves the job (its kolo run was stopped): why
//	elastic/node/J/done        set by node J once it has read the end order, or its refusal
//
// The serving node is a host too, with no number: it starts its own workers without orders.
const NodesKey = "elastic/nodes"

// Node j's keys, as the table above lists them.
func NodeKey(j int) string         { return "elastic/node/" + strconv.Itoa(j) }
func NodeWelcomeKey(j int) string  { return NodeKey(j) + "/welcome" }
func NodeOrderKey(j, k int) string { return NodeKey(j) + "/order/" + strconv.Itoa(k) }
func NodeExitKey(j, k int) string  { return NodeKey(j) + "/exit/" + strconv.Itoa(k) }
func NodeBeatKey(j int) string     { return NodeKey(j) + "/beat" }
func NodeLeftKey(j int) string     { return NodeKey(j) + "/left" }
func NodeDoneKey(j int) string     { return NodeKey(j) + "/done" }

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
	static := ""
	if n.Static {
		rank := "-"
		if n.NodeRank >= 0 {
			rank = strconv.Itoa(n.NodeRank)
		}
		static = fmt.Sprintf(" static %d %d %s", n.NNodes, n.NP, rank)
	}
	return fmt.Appendf(nil, "join %d %s %s%s\n%s", n.Slots, n.Hostname, orDash(n.Addr), static, n.Flags)
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
	nums, ok := numbers(f[1:])
	if !ok {
		return o, fmt.Errorf("node order: bad number in %q", head)
	}
	switch {
	case f[0] == "start" && len(nums) == 9:
		o = NodeOrder{Kind: OrderStart, Worker: nums[0], Slot: nums[1], Round: nums[2], Rank: nums[3], Size: nums[4],
			LocalRank: nums[5], LocalSize: nums[6], CrossRank: nums[7], CrossSize: nums[8]}
		// Only the numbers are checked: the host and the rendezvous are placeholders.
		j := jobenv.Job{Rank: o.Rank, Size: o.Size, LocalRank: o.LocalRank, LocalSize: o.LocalSize,
			CrossRank: o.CrossRank, CrossSize: o.CrossSize, Hostname: "-", Rendezvous: "-"}
		switch err := j.Validate(); {
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
	nums, ok := numbers(f[1:4])
	if !ok {
		return e, fmt.Errorf("worker exit: bad number in %q", head)
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

// numbers parses every field of f as a decimal number.
func numbers(f []string) ([]int, bool) {
	nums := make([]int, len(f))
	for i, s := range f {
		n, err := strconv.Atoi(s)
		if err != nil {
			return nil, false
		}
		nums[i] = n
	}
	return nums, true
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
