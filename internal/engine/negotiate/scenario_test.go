package negotiate

import (
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kolo-dl/kolo/internal/dtype"
	"github.com/kolo-dl/kolo/testbed/scripttest"
)

var rewrite = flag.Bool("rewrite", false, "rewrite testdata/*.txt with the output the code produces now")

// TestScenarios replays every testdata/*.txt script. A script is a series of blocks: command lines
// (and # comments), a "----" line, then the expected output up to a blank line. Commands:
//
//	config size=N [fusion=BYTES] [cache=N|off] [warn=DUR|off] [shutdown=DUR] [ranks=a,b,..]
//	                                (resets everything; ranks: a process set's job ranks)
//	submit RANKS KIND NAME [DTYPE SHAPE] [op=sum|avg|min|max|prod] [root=N] [pre=X] [post=X]
//	       [splits=a,b,..] [rows=a,b,..] [group=G/N] [average] [gpu] [full]
//	submit-id RANK ID [seen=N]      a raw cache id, bypassing the rank's cache
//	join RANKS
//	tick DUR                        advance the clock, run the stall inspector, print stalls+responses
//	ready                           print the responses Ready returns
//	lag RANKS / deliver RANKS       hold back / hand over responses to those ranks' caches
//	cache RANK|coord                print a cache's table
//
// RANKS is "*" or a list of ranks and ranges, in submission order: "2,0,1", "0-3,5". A submit goes
// through the rank's own Cache (compact when it hits, unless "full") and through the wire codec;
// responses reach every non-lagging rank through the codec and its Cache, and the driver checks
// that every up-to-date cache equals the coordinator's and that each rank's expanded copy of a
// response prints like the coordinator's. SHAPE is like [4,5]; for allgather, [*,3] with rows=
// gives each listed rank its own dim 0.
func TestScenarios(t *testing.T) {
	scripttest.RunDir(t, "testdata", *rewrite, func(t *testing.T) func(string) ([]string, error) {
		s := newScenario(t, Config{Size: 2})
		return func(line string) ([]string, error) {
			cmd := scripttest.Uncomment(line)
			if strings.TrimSpace(cmd) == "" {
				return nil, nil
			}
			return s.run(strings.Fields(cmd))
		}
	})
}

// scenario is one Coordinator with a simulated engine per rank: its Cache and its inbox.
type scenario struct {
	t       *testing.T
	cfg     Config
	co      *Coordinator
	now     time.Time
	workers []*Cache
	lagging []bool
	queued  [][][]byte // per rank: encoded responses not yet delivered
}

var epoch = time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)

func newScenario(t *testing.T, cfg Config) *scenario {
	co, err := NewCoordinator(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := &scenario{t: t, cfg: cfg, co: co, now: epoch, lagging: make([]bool, cfg.Size), queued: make([][][]byte, cfg.Size)}
	for r := 0; r < cfg.Size; r++ {
		w, err := NewCache(r, cfg.Size, cfg.CacheCapacity)
		if err != nil {
			t.Fatal(err)
		}
		s.workers = append(s.workers, w)
	}
	return s
}

func (s *scenario) run(f []string) ([]string, error) {
	switch f[0] {
	case "config":
		cfg := Config{Size: 2}
		for _, kv := range f[1:] {
			k, v, _ := strings.Cut(kv, "=")
			var err error
			switch k {
			case "size":
				cfg.Size, err = strconv.Atoi(v)
			case "fusion":
				cfg.FusionBytes, err = parseBytes(v)
			case "cache":
				if v == "off" {
					cfg.CacheCapacity = -1
				} else {
					cfg.CacheCapacity, err = strconv.Atoi(v)
				}
			case "warn":
				if v == "off" {
					cfg.StallWarning = -1
				} else {
					cfg.StallWarning, err = time.ParseDuration(v)
				}
			case "shutdown":
				cfg.StallShutdown, err = time.ParseDuration(v)
			case "crossed":
				cfg.StallCrossed, err = time.ParseDuration(v)
			case "ranks":
				cfg.Ranks, err = parseInts(v)
			default:
				err = fmt.Errorf("unknown config key %q", k)
			}
			if err != nil {
				return nil, err
			}
		}
		*s = *newScenario(s.t, cfg)
		return nil, nil
	case "submit":
		return s.submit(f[1:])
	case "submit-id":
		if len(f) < 3 {
			return nil, fmt.Errorf("usage: submit-id RANK ID [seen=N]")
		}
		r, err1 := strconv.Atoi(f[1])
		id, err2 := strconv.ParseUint(f[2], 10, 32)
		if err := firstErr(err1, err2); err != nil {
			return nil, err
		}
		seen := s.workers[r].Seen()
		if len(f) > 3 {
			v, err := strconv.ParseUint(strings.TrimPrefix(f[3], "seen="), 10, 64)
			if err != nil {
				return nil, err
			}
			seen = v
		}
		return s.send(&Batch{Rank: r, Seen: seen, Cached: []uint32{uint32(id)}})
	case "join":
		ranks, err := s.ranks(f[1])
		if err != nil {
			return nil, err
		}
		var out []string
		for _, r := range ranks {
			o, err := s.send(&Batch{Rank: r, Seen: s.workers[r].Seen(), Join: true})
			if err != nil {
				return nil, err
			}
			out = append(out, o...)
		}
		return out, nil
	case "tick":
		d, err := time.ParseDuration(f[1])
		if err != nil {
			return nil, err
		}
		s.now = s.now.Add(d)
		resps, stalls := s.co.Tick(s.now)
		var out []string
		for _, st := range stalls {
			out = append(out, st.String())
		}
		return append(out, s.deliver(resps)...), nil
	case "ready":
		out := s.deliver(s.co.Ready())
		if len(out) == 0 {
			out = []string{"(no responses)"}
		}
		return out, nil
	case "lag", "deliver":
		ranks, err := s.ranks(f[1])
		if err != nil {
			return nil, err
		}
		for _, r := range ranks {
			s.lagging[r] = f[0] == "lag"
			if f[0] == "deliver" {
				for _, msg := range s.queued[r] {
					s.learn(r, msg)
				}
				s.queued[r] = nil
			}
		}
		s.checkCaches()
		return nil, nil
	case "cache":
		return s.dumpCache(f[1])
	case "pending":
		return []string{fmt.Sprintf("%d pending", s.co.Pending())}, nil
	}
	return nil, fmt.Errorf("unknown command %q", f[0])
}

func firstErr(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

func parseBytes(v string) (int64, error) {
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		m      int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"B", 1}} {
		if strings.HasSuffix(v, u.suffix) {
			v, mult = strings.TrimSuffix(v, u.suffix), u.m
			break
		}
	}
	n, err := strconv.ParseInt(v, 10, 64)
	return n * mult, err
}

func (s *scenario) ranks(spec string) ([]int, error) {
	if spec == "*" {
		r := make([]int, s.cfg.Size)
		for i := range r {
			r[i] = i
		}
		return r, nil
	}
	var out []int
	for _, part := range strings.Split(spec, ",") {
		a, b, isRange := strings.Cut(part, "-")
		lo, err1 := strconv.Atoi(a)
		hi, err2 := lo, error(nil)
		if isRange {
			hi, err2 = strconv.Atoi(b)
		}
		if err := firstErr(err1, err2); err != nil {
			return nil, err
		}
		for i := lo; i <= hi; i++ {
			if i < 0 || i >= s.cfg.Size {
				return nil, fmt.Errorf("rank %d out of range", i)
			}
			out = append(out, i)
		}
	}
	return out, nil
}

func parseInts(spec string) ([]int, error) {
	var out []int
	for _, p := range strings.Split(strings.Trim(spec, "[]"), ",") {
		if p == "" {
			continue
		}
		n, err := strconv.Atoi(p)
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, nil
}

func (s *scenario) submit(f []string) ([]string, error) {
	if len(f) < 3 {
		return nil, fmt.Errorf("usage: submit RANKS KIND NAME [DTYPE SHAPE] [opts]")
	}
	ranks, err := s.ranks(f[0])
	if err != nil {
		return nil, err
	}
	kind, err := ParseOpKind(f[1])
	if err != nil {
		return nil, err
	}
	req := Request{Name: f[2], Kind: kind}
	rest := f[3:]
	var rows []int
	freeDim0 := false
	if kind != Barrier && len(rest) > 0 && !strings.Contains(rest[0], "=") {
		if req.DType, err = dtype.Parse(rest[0]); err != nil {
			req.DType = dtype.DType(200) // an invalid dtype, for the tests that send one
		}
		if len(rest) < 2 {
			return nil, fmt.Errorf("dtype with no shape")
		}
		shape := strings.Trim(rest[1], "[]")
		if strings.HasPrefix(shape, "*") {
			freeDim0 = true
			shape = "0" + shape[1:]
		}
		dims, err := parseInts(shape)
		if err != nil {
			return nil, err
		}
		for _, d := range dims {
			req.Shape = append(req.Shape, int64(d))
		}
		rest = rest[2:]
	}
	if usesReduce(kind) {
		req.ReduceOp = ReduceSum
	}
	full := false
	for _, kv := range rest {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "full":
			full = true
		case "average":
			req.Average = true
		case "gpu":
			req.GPU = true
		case "op":
			switch v {
			case "avg", "average":
				req.ReduceOp, req.Average = ReduceSum, true
			case "sum":
				req.ReduceOp = ReduceSum
			case "min":
				req.ReduceOp = ReduceMin
			case "max":
				req.ReduceOp = ReduceMax
			case "prod":
				req.ReduceOp = ReduceProd
			default:
				n, err := strconv.Atoi(v)
				if err != nil {
					return nil, err
				}
				req.ReduceOp = uint8(n)
			}
		case "root":
			req.Root, err = strconv.Atoi(v)
		case "pre":
			req.PreScale, err = strconv.ParseFloat(v, 64)
		case "post":
			req.PostScale, err = strconv.ParseFloat(v, 64)
		case "splits":
			var sp []int
			sp, err = parseInts(v)
			req.Splits = []int64{}
			for _, x := range sp {
				req.Splits = append(req.Splits, int64(x))
			}
		case "refuse":
			req.Error = strings.ReplaceAll(v, "_", " ")
		case "rows":
			rows, err = parseInts(v)
		case "group":
			g, n, _ := strings.Cut(v, "/")
			var gi int
			gi, err = strconv.Atoi(g)
			req.Group = int64(gi)
			if err == nil {
				req.GroupSize, err = strconv.Atoi(n)
			}
		default:
			return nil, fmt.Errorf("unknown option %q", kv)
		}
		if err != nil {
			return nil, fmt.Errorf("option %q: %v", kv, err)
		}
	}
	if freeDim0 && len(rows) != len(ranks) {
		return nil, fmt.Errorf("shape [*,...] needs rows= with one count per listed rank")
	}
	var out []string
	for i, r := range ranks {
		q := req
		if freeDim0 {
			q.Shape = slices.Clone(req.Shape)
			q.Shape[0] = int64(rows[i])
		}
		b := &Batch{Rank: r, Seen: s.workers[r].Seen()}
		if full {
			b.Requests = []Request{q}
		} else {
			s.workers[r].Compact(b, q)
		}
		o, err := s.send(b)
		if err != nil {
			return nil, err
		}
		out = append(out, o...)
	}
	return out, nil
}

// send moves a batch through the codec to the coordinator, as the engine would.
func (s *scenario) send(b *Batch) ([]string, error) {
	msg := EncodeBatch(nil, b)
	got, err := DecodeBatch(msg)
	if err != nil {
		s.t.Fatalf("batch from rank %d does not decode: %v", b.Rank, err)
	}
	if err := s.co.SubmitBatch(s.now, got); err != nil {
		return []string{"error: " + err.Error()}, nil
	}
	return nil, nil
}

// deliver prints resps and hands them, through the codec, to every rank's cache.
func (s *scenario) deliver(resps []Response) []string {
	var out []string
	for i := range resps {
		out = append(out, formatResponse(&resps[i]))
	}
	if len(resps) == 0 {
		return out
	}
	msg := EncodeResponses(nil, resps)
	for r := range s.workers {
		if s.lagging[r] {
			s.queued[r] = append(s.queued[r], msg)
			continue
		}
		learned := s.learn(r, msg)
		for i := range learned {
			if resps[i].Error != "" && len(resps[i].Names) == 0 {
				continue // names filled per rank
			}
			if a, b := formatResponse(&learned[i]), formatResponse(&resps[i]); a != b {
				s.t.Errorf("rank %d learned response\n%s\nbut the coordinator sent\n%s", r, a, b)
			}
		}
	}
	s.checkCaches()
	return out
}

func (s *scenario) learn(r int, msg []byte) []Response {
	got, err := DecodeResponses(msg)
	if err != nil {
		s.t.Fatalf("responses do not decode: %v", err)
	}
	for i := range got {
		if err := s.workers[r].Learn(&got[i]); err != nil {
			s.t.Fatalf("rank %d: %v", r, err)
		}
	}
	return got
}

// checkCaches compares every up-to-date rank's cache with the coordinator's.
func (s *scenario) checkCaches() {
	s.t.Helper()
	want := s.co.cache.table()
	for r, w := range s.workers {
		if len(s.queued[r]) > 0 {
			continue
		}
		if err := cacheAgrees(w, want); err != nil {
			s.t.Errorf("rank %d: %v", r, err)
		}
	}
}

func cacheAgrees(w *Cache, want map[uint32]*opSig) error {
	if w.Len() != len(want) {
		return fmt.Errorf("cache holds %d ids, coordinator %d", w.Len(), len(want))
	}
	for id, sig := range want {
		got := w.get(id)
		if got == nil || !sigEqual(got, sig) {
			return fmt.Errorf("cache id %d: rank has %+v, coordinator %+v", id, got, sig)
		}
		if w.byName[sig.name] != id {
			return fmt.Errorf("name %q: rank maps it to %d, coordinator to %d", sig.name, w.byName[sig.name], id)
		}
	}
	return nil
}

func (s *scenario) dumpCache(who string) ([]string, error) {
	var out []string
	if who == "coord" {
		t := s.co.cache.table()
		ids := make([]uint32, 0, len(t))
		for id := range t {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		for _, id := range ids {
			out = append(out, fmt.Sprintf("id %d: %s", id, formatSig(t[id])))
		}
		for _, e := range s.co.cache.tombs {
			out = append(out, fmt.Sprintf("evicted id %d (%s) in #%d, awaiting every rank", e.id, e.sig.name, e.evictedSeq))
		}
		return out, nil
	}
	r, err := strconv.Atoi(who)
	if err != nil {
		return nil, err
	}
	w := s.workers[r]
	for id, sig := range w.slots {
		if sig != nil {
			out = append(out, fmt.Sprintf("id %d: %s", id, formatSig(sig)))
		}
	}
	if len(out) == 0 {
		out = []string{"(empty)"}
	}
	return out, nil
}

func formatSig(s *opSig) string {
	r := Response{Kind: s.kind, Names: []string{s.name}, DType: s.dtype, ReduceOp: s.reduceOp, Average: s.average,
		GPU: s.gpu, PreScale: s.pre, PostScale: s.post, Root: s.root, Group: s.group, GroupSize: s.groupSize,
		Shapes: [][]int64{s.shape}, Splits: s.splits}
	if s.dim0 != nil {
		r.Dim0 = [][]int64{s.dim0}
	}
	t := formatResponse(&r)
	return t[strings.Index(t, " ")+1:]
}

// formatResponse is how scenarios print a response: one line.
func formatResponse(r *Response) string {
	var b strings.Builder
	fmt.Fprintf(&b, "#%d ", r.Seq)
	ids := func(label string, v []uint32) {
		if len(v) == 0 {
			return
		}
		b.WriteString(" " + label + "=")
		for i, id := range v {
			if i > 0 {
				b.WriteByte(',')
			}
			if id == NoCacheID {
				b.WriteByte('-')
			} else {
				fmt.Fprintf(&b, "%d", id)
			}
		}
	}
	if r.Error != "" {
		fmt.Fprintf(&b, "error [%s]", strings.Join(r.Names, " "))
		ids("ids", r.CacheIDs)
		if r.Resync != 0 {
			fmt.Fprintf(&b, " resync=%d", r.Resync)
		}
		if len(r.Ended) > 0 {
			fmt.Fprintf(&b, " ended=%v", r.Ended)
		}
		if r.Cause != Failed {
			b.WriteString(" " + r.Cause.String())
		}
		b.WriteString(": " + r.Error)
		return b.String()
	}
	if r.Kind == Join {
		fmt.Fprintf(&b, "join last=%d", r.LastJoined)
		return b.String()
	}
	b.WriteString(r.Kind.String())
	if r.Kind != Barrier {
		b.WriteString(" " + r.DType.String())
	}
	if r.GPU {
		b.WriteString(" gpu")
	}
	if usesReduce(r.Kind) {
		b.WriteString(" " + ReduceOpName(r.ReduceOp, r.Average))
		if r.PreScale != 1 || r.PostScale != 1 {
			fmt.Fprintf(&b, " pre=%g post=%g", r.PreScale, r.PostScale)
		}
	}
	if r.Kind == Broadcast {
		fmt.Fprintf(&b, " root=%d", r.Root)
	}
	if r.Group != 0 {
		fmt.Fprintf(&b, " group=%d/%d", r.Group, r.GroupSize)
	}
	if len(r.Joined) > 0 {
		b.WriteString(" joined=" + formatRanks(r.Joined))
	}
	if r.FromCache {
		b.WriteString(" cached")
	}
	b.WriteByte(':')
	for i, n := range r.Names {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(" " + n)
		if r.Kind == Barrier {
			continue
		}
		if i < len(r.Shapes) {
			b.WriteString(" " + formatShape(r.Shapes[i]))
		}
		if r.Kind == Allgather && i < len(r.Dim0) {
			b.WriteString(" rows=" + commas(r.Dim0[i]))
		}
		if r.Kind == Alltoall {
			b.WriteString(" splits=")
			for j, row := range r.Splits {
				if j > 0 {
					b.WriteByte('|')
				}
				b.WriteString(commas(row))
			}
		}
	}
	ids("ids", r.CacheIDs)
	ids("evict", r.Evict)
	return b.String()
}

func commas(v []int64) string {
	return strings.ReplaceAll(strings.Trim(formatShape(v), "[]"), " ", ",")
}
