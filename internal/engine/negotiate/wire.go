package negotiate

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"time"

	"github.com/kolo-dl/kolo/internal/dtype"
)

// The wire format of the engine's control messages. Every message starts with the format version
// and a MsgKind byte; integers are varints (signed ones zigzag), floats 8 bytes little-endian,
// strings a length then bytes. Decoders trust nothing: every count is checked against the limits
// below and against the bytes left, so a hostile or corrupt message costs at most a few times its
// own size in memory and ends in an error wrapping ErrMalformed, never a panic.

// WireVersion is the first byte of every message. A change that old decoders would misread bumps it.
const WireVersion = 1

// MsgKind is the second byte of every message.
type MsgKind uint8

const (
	MsgBatch     MsgKind = 1 // a Batch: one rank's requests to the Coordinator
	MsgResponses MsgKind = 2 // Responses, in stream order, from rank 0 to every rank
	MsgAbort     MsgKind = 3 // an Abort: a rank was lost or gave up
	// MsgSetResponses is MsgResponses of a process set other than the global one: the set id, then
	// the same body.
	MsgSetResponses MsgKind = 4
	// MsgSettings is a Settings change, from rank 0 (the autotuner) to every rank.
	MsgSettings MsgKind = 6
	// MsgKeepAlive is rank 0 telling a rank whose requests it holds unanswered that it is still
	// running (its coordinator waits on other ranks): a header and nothing else.
	MsgKeepAlive MsgKind = 5
)

// Decoder limits.
const (
	MaxNameLen   = 4 << 10  // bytes of a tensor name
	MaxErrorLen  = 64 << 10 // bytes of an error message or abort reason
	MaxDims      = 64       // dims of a shape
	MaxRanks     = 1 << 20  // ranks: entries of a splits row, a Dim0 list, a joined list; rank numbers
	MaxItems     = 1 << 20  // requests, cached ids, responses or names in one message
	MaxCacheIDs  = 1 << 20  // the cache id space (Config.CacheCapacity is capped to half of it)
	MaxSetID     = 1 << 30  // process set ids
	batchJoin    = 1 << 0
	batchSet     = 1 << 1 // a set id follows the flags (absent: the global set)
	cachedNone   = 0
	cachedList   = 1
	cachedBitset = 2
)

// ErrMalformed is wrapped by every decoding error.
var ErrMalformed = errors.New("malformed negotiation message")

// Abort tells every rank that Rank was lost or gave up, and why; the engine fails everything
// pending with Reason. Stalled marks the notice of a progress deadline: Rank waited on rank
// StalledOn inside a collective, and StalledOn moved nothing for the whole timeout (StalledOn may
// itself be waiting on another rank: the engine follows the chain).
type Abort struct {
	Rank      int
	Reason    string
	Stalled   bool
	StalledOn int
}

// PeekKind returns the kind of an encoded message so that the engine can pick its decoder.
func PeekKind(p []byte) (MsgKind, error) {
	if len(p) < 2 {
		return 0, fmt.Errorf("negotiate: %w: %d bytes, too short for a header", ErrMalformed, len(p))
	}
	if p[0] != WireVersion {
		return 0, fmt.Errorf("negotiate: %w: wire version %d, want %d (are all ranks running the same kolo?)", ErrMalformed, p[0], WireVersion)
	}
	return MsgKind(p[1]), nil
}

// Request flags.
const (
	reqAverage = 1 << iota
	reqScales
	reqSplits
	reqGroup
	reqRoot
	reqError
	reqGPU
	reqAll = reqAverage | reqScales | reqSplits | reqGroup | reqRoot | reqError | reqGPU
)

// EncodeBatch appends b's message to dst. Cached ids travel as a set: a bitset or a delta list,
// whichever is smaller, decoded in ascending order.
func EncodeBatch(dst []byte, b *Batch) []byte {
	dst = append(dst, WireVersion, byte(MsgBatch))
	dst = binary.AppendUvarint(dst, uint64(b.Rank))
	dst = binary.AppendUvarint(dst, b.Seen)
	var flags byte
	if b.Join {
		flags |= batchJoin
	}
	if b.Set != 0 {
		flags |= batchSet
	}
	dst = append(dst, flags)
	if b.Set != 0 {
		dst = binary.AppendUvarint(dst, uint64(b.Set))
	}
	dst = binary.AppendUvarint(dst, uint64(len(b.Requests)))
	for i := range b.Requests {
		dst = appendRequest(dst, &b.Requests[i])
	}
	return appendCached(dst, b.Cached)
}

func appendRequest(dst []byte, r *Request) []byte {
	dst = appendString(dst, r.Name)
	dst = append(dst, byte(r.Kind), byte(r.DType), r.ReduceOp)
	var flags byte
	if r.Average {
		flags |= reqAverage
	}
	if r.GPU {
		flags |= reqGPU
	}
	if r.PreScale != 0 || r.PostScale != 0 {
		flags |= reqScales
	}
	if r.Splits != nil {
		flags |= reqSplits
	}
	if r.Group != 0 || r.GroupSize != 0 {
		flags |= reqGroup
	}
	if r.Root != 0 {
		flags |= reqRoot
	}
	if r.Error != "" {
		flags |= reqError
	}
	dst = append(dst, flags)
	dst = appendInts(dst, r.Shape)
	if flags&reqRoot != 0 {
		dst = binary.AppendVarint(dst, int64(r.Root))
	}
	if flags&reqScales != 0 {
		dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(r.PreScale))
		dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(r.PostScale))
	}
	if flags&reqSplits != 0 {
		dst = appendInts(dst, r.Splits)
	}
	if flags&reqGroup != 0 {
		dst = binary.AppendVarint(dst, r.Group)
		dst = binary.AppendVarint(dst, int64(r.GroupSize))
	}
	if flags&reqError != 0 {
		dst = appendString(dst, r.Error)
	}
	return dst
}

func appendCached(dst []byte, ids []uint32) []byte {
	if len(ids) == 0 {
		return append(dst, cachedNone)
	}
	sorted := slices.IsSorted(ids)
	if !sorted {
		ids = slices.Clone(ids)
		slices.Sort(ids)
	}
	strict := true
	listLen := 0
	prev := uint32(0)
	for i, id := range ids {
		if i > 0 && id == prev {
			strict = false
		}
		listLen += varintLen(uint64(id - prev))
		prev = id
	}
	maxID := ids[len(ids)-1]
	if nbytes := int(maxID/8) + 1; strict && maxID < MaxCacheIDs && nbytes < listLen {
		dst = append(dst, cachedBitset)
		dst = binary.AppendUvarint(dst, uint64(nbytes))
		start := len(dst)
		dst = append(dst, make([]byte, nbytes)...)
		for _, id := range ids {
			dst[start+int(id/8)] |= 1 << (id % 8)
		}
		return dst
	}
	dst = append(dst, cachedList)
	dst = binary.AppendUvarint(dst, uint64(len(ids)))
	prev = 0
	for _, id := range ids {
		dst = binary.AppendUvarint(dst, uint64(id-prev))
		prev = id
	}
	return dst
}

func varintLen(v uint64) int { return (bits.Len64(v|1) + 6) / 7 }

// DecodeBatch decodes a MsgBatch message.
func DecodeBatch(p []byte) (*Batch, error) {
	d := decoder{p: p, msg: "batch"}
	d.header(MsgBatch)
	b := &Batch{}
	b.Rank = d.rank("rank")
	b.Seen = d.uvarint("seen")
	flags := d.byte("flags")
	if flags&^(batchJoin|batchSet) != 0 {
		d.fail("unknown batch flags %#x", flags)
	}
	b.Join = flags&batchJoin != 0
	if flags&batchSet != 0 {
		b.Set = d.setID()
	}
	if n := d.count("requests", MaxItems); n > 0 {
		b.Requests = make([]Request, n)
		for i := range b.Requests {
			d.request(&b.Requests[i])
		}
	}
	switch mode := d.byte("cached mode"); mode {
	case cachedNone:
	case cachedList:
		n := d.count("cached ids", MaxItems)
		if n > 0 {
			b.Cached = make([]uint32, n)
		}
		var id uint64
		for i := range b.Cached {
			id += d.uvarint("cached id")
			if id >= MaxCacheIDs {
				d.fail("cached id %d beyond %d", id, MaxCacheIDs)
				break
			}
			b.Cached[i] = uint32(id)
		}
	case cachedBitset:
		n := d.count("cached bitset bytes", MaxCacheIDs/8)
		set := d.bytes(n)
		for i, x := range set {
			for x != 0 {
				bit := bits.TrailingZeros8(x)
				b.Cached = append(b.Cached, uint32(i*8+bit))
				x &^= 1 << bit
			}
		}
	default:
		d.fail("unknown cached-id mode %d", mode)
	}
	if err := d.end(); err != nil {
		return nil, err
	}
	return b, nil
}

func (d *decoder) request(r *Request) {
	r.Name = d.str("name", MaxNameLen)
	r.Kind = OpKind(d.byte("kind"))
	r.DType = dtype.DType(d.byte("dtype"))
	r.ReduceOp = d.byte("reduce op")
	flags := d.byte("request flags")
	if flags&^reqAll != 0 {
		d.fail("unknown request flags %#x", flags)
	}
	r.Average = flags&reqAverage != 0
	r.GPU = flags&reqGPU != 0
	r.Shape = d.ints("shape", MaxDims)
	if flags&reqRoot != 0 {
		r.Root = d.int("root")
	}
	if flags&reqScales != 0 {
		r.PreScale = d.float("prescale")
		r.PostScale = d.float("postscale")
	}
	if flags&reqSplits != 0 {
		r.Splits = d.ints("splits", MaxRanks)
		if r.Splits == nil && d.err == nil {
			r.Splits = []int64{}
		}
	}
	if flags&reqGroup != 0 {
		r.Group = d.varint("group")
		r.GroupSize = d.int("group size")
	}
	if flags&reqError != 0 {
		r.Error = d.str("refusal", MaxErrorLen)
		if r.Error == "" && d.err == nil {
			d.fail("empty refusal")
		}
	}
}

// Response flags.
const (
	respFromCache = 1 << iota
	respAverage
	respScales
	respError
	respGroup
	respDim0
	respSplits
	respRoot
	respResync
	respTune
	respGPU
	respEnded
	respCause
	respAll = respFromCache | respAverage | respScales | respError | respGroup | respDim0 | respSplits | respRoot | respResync | respTune | respGPU | respEnded | respCause
)

// EncodeResponses appends rs's message to dst. A FromCache Response travels as its cache ids (and
// evictions) only: the receiving Cache.Learn fills in the rest.
func EncodeResponses(dst []byte, rs []Response) []byte {
	return EncodeSetResponses(dst, 0, rs)
}

// EncodeSetResponses appends the message of rs, responses of process set `set`, to dst: a
// MsgResponses for the global set (0), else a MsgSetResponses.
func EncodeSetResponses(dst []byte, set int, rs []Response) []byte {
	if set == 0 {
		dst = append(dst, WireVersion, byte(MsgResponses))
	} else {
		dst = append(dst, WireVersion, byte(MsgSetResponses))
		dst = binary.AppendUvarint(dst, uint64(set))
	}
	dst = binary.AppendUvarint(dst, uint64(len(rs)))
	for i := range rs {
		dst = appendResponse(dst, &rs[i])
	}
	return dst
}

func appendResponse(dst []byte, r *Response) []byte {
	dst = binary.AppendUvarint(dst, r.Seq)
	dst = append(dst, byte(r.Kind))
	if r.FromCache {
		dst = binary.AppendUvarint(dst, respFromCache)
		dst = appendIDs(dst, r.CacheIDs)
		return appendIDs(dst, r.Evict)
	}
	var flags uint64
	if r.Average {
		flags |= respAverage
	}
	if r.GPU {
		flags |= respGPU
	}
	if r.PreScale != 0 || r.PostScale != 0 {
		flags |= respScales
	}
	if r.Error != "" {
		flags |= respError
	}
	if r.Group != 0 || r.GroupSize != 0 {
		flags |= respGroup
	}
	if r.Dim0 != nil {
		flags |= respDim0
	}
	if r.Splits != nil {
		flags |= respSplits
	}
	if r.Root != 0 {
		flags |= respRoot
	}
	if r.Resync != 0 {
		flags |= respResync
	}
	if len(r.Ended) > 0 {
		flags |= respEnded
	}
	if r.Cause != Failed {
		flags |= respCause
	}
	if r.Kind == Retune {
		flags |= respTune
	}
	dst = binary.AppendUvarint(dst, flags)
	if flags&respTune != 0 {
		return appendCollectives(dst, r.Tune)
	}
	if r.Error != "" {
		dst = appendString(dst, r.Error)
	}
	if flags&respEnded != 0 {
		dst = binary.AppendUvarint(dst, uint64(len(r.Ended)))
		for _, e := range r.Ended {
			dst = binary.AppendUvarint(dst, uint64(e))
		}
	}
	if flags&respResync != 0 {
		dst = binary.AppendUvarint(dst, r.Resync)
	}
	if flags&respCause != 0 {
		dst = append(dst, byte(r.Cause))
	}
	dst = binary.AppendUvarint(dst, uint64(len(r.Names)))
	for _, n := range r.Names {
		dst = appendString(dst, n)
	}
	dst = append(dst, byte(r.DType), r.ReduceOp)
	if flags&respRoot != 0 {
		dst = binary.AppendVarint(dst, int64(r.Root))
	}
	if flags&respScales != 0 {
		dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(r.PreScale))
		dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(r.PostScale))
	}
	if flags&respGroup != 0 {
		dst = binary.AppendVarint(dst, r.Group)
		dst = binary.AppendVarint(dst, int64(r.GroupSize))
	}
	dst = appendMatrix(dst, r.Shapes)
	if flags&respDim0 != 0 {
		dst = appendMatrix(dst, r.Dim0)
	}
	if flags&respSplits != 0 {
		dst = appendMatrix(dst, r.Splits)
	}
	dst = binary.AppendUvarint(dst, uint64(len(r.Joined)))
	for _, j := range r.Joined {
		dst = binary.AppendUvarint(dst, uint64(j))
	}
	dst = binary.AppendVarint(dst, int64(r.LastJoined))
	dst = appendIDs(dst, r.CacheIDs)
	return appendIDs(dst, r.Evict)
}

// appendIDs writes cache ids shifted by one so that NoCacheID is 0.
func appendIDs(dst []byte, ids []uint32) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(ids)))
	for _, id := range ids {
		if id == NoCacheID {
			dst = append(dst, 0)
		} else {
			dst = binary.AppendUvarint(dst, uint64(id)+1)
		}
	}
	return dst
}

func appendMatrix(dst []byte, m [][]int64) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(m)))
	for _, row := range m {
		dst = appendInts(dst, row)
	}
	return dst
}

// DecodeResponses decodes a MsgResponses message. FromCache Responses come back with only Seq,
// Kind, CacheIDs and Evict set: pass each to Cache.Learn, which completes them.
func DecodeResponses(p []byte) ([]Response, error) {
	set, rs, err := DecodeSetResponses(p)
	if err == nil && set != 0 {
		return nil, fmt.Errorf("negotiate: decode responses: %w: responses of process set %d where the global set's were expected", ErrMalformed, set)
	}
	return rs, err
}

// DecodeSetResponses decodes a MsgResponses (set 0) or MsgSetResponses message: the process set
// and its responses, as DecodeResponses returns them.
func DecodeSetResponses(p []byte) (int, []Response, error) {
	d := decoder{p: p, msg: "responses"}
	set := 0
	if k, err := PeekKind(p); err == nil && k == MsgSetResponses {
		d.header(MsgSetResponses)
		if set = d.setID(); set == 0 && d.err == nil {
			d.fail("set responses for the global set")
		}
	} else {
		d.header(MsgResponses)
	}
	n := d.count("responses", MaxItems)
	var rs []Response
	if n > 0 {
		rs = make([]Response, n)
	}
	for i := range rs {
		if d.err != nil {
			break
		}
		d.response(&rs[i])
	}
	if err := d.end(); err != nil {
		return 0, nil, err
	}
	return set, rs, nil
}

func (d *decoder) response(r *Response) {
	r.Seq = d.uvarint("seq")
	r.Kind = OpKind(d.byte("kind"))
	flags := d.uvarint("response flags")
	if flags&^respAll != 0 {
		d.fail("unknown response flags %#x", flags)
		return
	}
	if flags&respFromCache != 0 {
		if flags != respFromCache {
			d.fail("cached response with other flags %#x", flags)
			return
		}
		r.FromCache = true
		r.CacheIDs = d.ids("cache ids")
		if len(r.CacheIDs) == 0 && d.err == nil {
			d.fail("cached response names no cache id")
		}
		if slices.Contains(r.CacheIDs, NoCacheID) {
			d.fail("cached response with a tensor that has no cache id")
		}
		r.Evict = d.ids("evicted ids")
		return
	}
	if (flags&respTune != 0) != (r.Kind == Retune) {
		d.fail("response of kind %v with tune flag %v", r.Kind, flags&respTune != 0)
		return
	}
	if flags&respTune != 0 {
		if flags != respTune {
			d.fail("retune response with other flags %#x", flags)
			return
		}
		r.Tune = d.collectives()
		return
	}
	r.Average = flags&respAverage != 0
	r.GPU = flags&respGPU != 0
	if flags&respError != 0 {
		r.Error = d.str("error", MaxErrorLen)
		if r.Error == "" && d.err == nil {
			d.fail("error flag with an empty error")
		}
	}
	if flags&respEnded != 0 {
		if flags&respError == 0 {
			d.fail("ended ranks without an error")
			return
		}
		n := d.count("ended ranks", MaxRanks)
		if n == 0 && d.err == nil {
			d.fail("ended flag with no ranks")
		}
		for range n {
			r.Ended = append(r.Ended, d.rank("ended rank"))
		}
	}
	if flags&respResync != 0 {
		r.Resync = d.uvarint("resync")
	}
	if flags&respCause != 0 {
		if flags&respError == 0 {
			d.fail("a cause without an error")
			return
		}
		r.Cause = Cause(d.byte("cause"))
		if (r.Cause == Failed || r.Cause > Mismatch) && d.err == nil {
			d.fail("unknown cause %d", r.Cause)
		}
	}
	if n := d.count("names", MaxItems); n > 0 {
		r.Names = make([]string, n)
		for i := range r.Names {
			r.Names[i] = d.str("name", MaxNameLen)
		}
	}
	r.DType = dtype.DType(d.byte("dtype"))
	r.ReduceOp = d.byte("reduce op")
	if flags&respRoot != 0 {
		r.Root = d.int("root")
	}
	if flags&respScales != 0 {
		r.PreScale = d.float("prescale")
		r.PostScale = d.float("postscale")
	}
	if flags&respGroup != 0 {
		r.Group = d.varint("group")
		r.GroupSize = d.int("group size")
	}
	r.Shapes = d.matrix("shapes", MaxItems, MaxDims)
	if flags&respDim0 != 0 {
		r.Dim0 = d.matrix("dim0", MaxItems, MaxRanks)
		if r.Dim0 == nil && d.err == nil {
			r.Dim0 = [][]int64{}
		}
	}
	if flags&respSplits != 0 {
		r.Splits = d.matrix("splits", MaxRanks, MaxRanks)
		if r.Splits == nil && d.err == nil {
			r.Splits = [][]int64{}
		}
	}
	if n := d.count("joined ranks", MaxRanks); n > 0 {
		r.Joined = make([]int, n)
		for i := range r.Joined {
			r.Joined[i] = d.rank("joined rank")
		}
	}
	r.LastJoined = d.int("last joined")
	r.CacheIDs = d.ids("cache ids")
	r.Evict = d.ids("evicted ids")
	if slices.Contains(r.Evict, NoCacheID) {
		d.fail("eviction of no cache id")
	}
}

func appendCollectives(dst []byte, c Collectives) []byte {
	dst = binary.AppendVarint(dst, c.SmallAllreduceBytes)
	dst = binary.AppendVarint(dst, c.SharedRoundBytes)
	if c.Hierarchical {
		return append(dst, 1)
	}
	return append(dst, 0)
}

func (d *decoder) collectives() Collectives {
	c := Collectives{SmallAllreduceBytes: d.varint("small allreduce bytes"), SharedRoundBytes: d.varint("shared round bytes")}
	switch h := d.byte("hierarchical"); h {
	case 0:
	case 1:
		c.Hierarchical = true
	default:
		d.fail("hierarchical %d: want 0 or 1", h)
	}
	if d.err == nil && (c.SmallAllreduceBytes < 0 || c.SmallAllreduceBytes > MaxCollectiveBytes ||
		c.SharedRoundBytes < 0 || c.SharedRoundBytes > MaxCollectiveBytes) {
		d.fail("collective settings out of range: small allreduce %d bytes, shared round %d bytes", c.SmallAllreduceBytes, c.SharedRoundBytes)
	}
	return c
}

// EncodeAbort appends a's message to dst. A stall notice ends with StalledOn; other notices end
// with the reason.
func EncodeAbort(dst []byte, a Abort) []byte {
	dst = append(dst, WireVersion, byte(MsgAbort))
	dst = binary.AppendUvarint(dst, uint64(a.Rank))
	dst = appendString(dst, a.Reason)
	if a.Stalled {
		dst = binary.AppendUvarint(dst, uint64(a.StalledOn))
	}
	return dst
}

// DecodeAbort decodes a MsgAbort message.
func DecodeAbort(p []byte) (Abort, error) {
	d := decoder{p: p, msg: "abort"}
	d.header(MsgAbort)
	a := Abort{Rank: d.rank("rank"), Reason: d.str("reason", MaxErrorLen)}
	if d.err == nil && d.off < len(d.p) {
		a.Stalled, a.StalledOn = true, d.rank("stalled rank")
	}
	return a, d.end()
}

// Settings is a change of the tunable settings that every rank applies from the same optimizer
// step (the autotuner's samples, then its decision).
type Settings struct {
	// From is the first step the settings apply to: every rank switches when its step count
	// reaches it.
	From int64
	// FusionBytes is the fusion threshold (0: no fusion); CycleTime the negotiation cycle time.
	FusionBytes int64
	CycleTime   time.Duration
	// Collectives are the collective settings rank 0 brings into force (by a Retune response)
	// when it reaches From: the other ranks learn them from that response, not from here.
	Collectives Collectives
	// SpinTime is how long each rank's waits poll before they sleep, from From on; 0: unchanged.
	SpinTime time.Duration
	// Cache turns the response cache off or on from From (rank 0's Hub, SetCacheOff); the
	// other ranks follow the evictions in the response stream and need nothing from here.
	Cache CacheSwitch
}

// CacheSwitch is Settings.Cache.
type CacheSwitch uint8

const (
	CacheUnchanged CacheSwitch = iota
	CacheOff
	CacheOn
)

// EncodeSettings appends s's message to dst.
func EncodeSettings(dst []byte, s Settings) []byte {
	dst = append(dst, WireVersion, byte(MsgSettings))
	dst = binary.AppendVarint(dst, s.From)
	dst = binary.AppendVarint(dst, s.FusionBytes)
	dst = binary.AppendVarint(dst, int64(s.CycleTime))
	dst = appendCollectives(dst, s.Collectives)
	dst = binary.AppendVarint(dst, int64(s.SpinTime))
	return append(dst, byte(s.Cache))
}

// DecodeSettings decodes a MsgSettings message.
func DecodeSettings(p []byte) (Settings, error) {
	d := decoder{p: p, msg: "settings"}
	d.header(MsgSettings)
	s := Settings{From: d.varint("from"), FusionBytes: d.varint("fusion bytes"), CycleTime: time.Duration(d.varint("cycle time"))}
	s.Collectives = d.collectives()
	s.SpinTime = time.Duration(d.varint("spin time"))
	s.Cache = CacheSwitch(d.byte("response cache"))
	if d.err == nil && (s.From < 1 || s.FusionBytes < 0 || s.CycleTime < 0 || s.SpinTime < 0 || s.Cache > CacheOn) {
		d.fail("settings out of range: from step %d, fusion %d bytes, cycle %v, spin %v, response cache %d", s.From, s.FusionBytes, s.CycleTime, s.SpinTime, s.Cache)
	}
	return s, d.end()
}

// EncodeKeepAlive appends a MsgKeepAlive message to dst.
func EncodeKeepAlive(dst []byte) []byte { return append(dst, WireVersion, byte(MsgKeepAlive)) }

// DecodeKeepAlive checks a MsgKeepAlive message.
func DecodeKeepAlive(p []byte) error {
	d := decoder{p: p, msg: "keep-alive"}
	d.header(MsgKeepAlive)
	return d.end()
}

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

func appendInts(dst []byte, v []int64) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(v)))
	for _, x := range v {
		dst = binary.AppendVarint(dst, x)
	}
	return dst
}

// decoder reads one message; the first error sticks and later reads return zero values.
type decoder struct {
	p   []byte
	off int
	msg string
	err error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("negotiate: decode %s at byte %d: %w: %s", d.msg, d.off, ErrMalformed, fmt.Sprintf(format, args...))
	}
}

func (d *decoder) header(want MsgKind) {
	k, err := PeekKind(d.p)
	if err != nil {
		d.err = err
		return
	}
	if k != want {
		d.fail("message kind %d, want %d", k, want)
		return
	}
	d.off = 2
}

func (d *decoder) end() error {
	if d.err == nil && d.off != len(d.p) {
		d.fail("%d trailing bytes", len(d.p)-d.off)
	}
	return d.err
}

func (d *decoder) byte(what string) byte {
	if d.err != nil {
		return 0
	}
	if d.off >= len(d.p) {
		d.fail("truncated before %s", what)
		return 0
	}
	b := d.p[d.off]
	d.off++
	return b
}

func (d *decoder) bytes(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n > len(d.p)-d.off {
		d.fail("truncated: %d bytes wanted, %d left", n, len(d.p)-d.off)
		return nil
	}
	b := d.p[d.off : d.off+n]
	d.off += n
	return b
}

func (d *decoder) uvarint(what string) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.p[d.off:])
	if n <= 0 {
		d.fail("bad varint for %s", what)
		return 0
	}
	d.off += n
	return v
}

func (d *decoder) varint(what string) int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.p[d.off:])
	if n <= 0 {
		d.fail("bad varint for %s", what)
		return 0
	}
	d.off += n
	return v
}

// int reads a signed value that must fit in 32 bits (roots, group sizes).
func (d *decoder) int(what string) int {
	v := d.varint(what)
	if v < math.MinInt32 || v > math.MaxInt32 {
		d.fail("%s %d out of range", what, v)
		return 0
	}
	return int(v)
}

func (d *decoder) rank(what string) int {
	v := d.uvarint(what)
	if v >= MaxRanks {
		d.fail("%s %d beyond %d", what, v, MaxRanks)
		return 0
	}
	return int(v)
}

func (d *decoder) setID() int {
	v := d.uvarint("process set")
	if v >= MaxSetID {
		d.fail("process set %d beyond %d", v, MaxSetID)
		return 0
	}
	return int(v)
}

func (d *decoder) float(what string) float64 {
	b := d.bytes(8)
	if b == nil {
		if d.err == nil {
			d.fail("truncated before %s", what)
		}
		return 0
	}
	return math.Float64frombits(binary.LittleEndian.Uint64(b))
}

// count reads a length, checked against max and against the bytes left (every element takes at
// least one byte), so that no allocation outgrows the message.
func (d *decoder) count(what string, max int) int {
	v := d.uvarint(what)
	if d.err != nil {
		return 0
	}
	if v > uint64(max) {
		d.fail("%d %s, more than %d", v, what, max)
		return 0
	}
	if v > uint64(len(d.p)-d.off) {
		d.fail("%d %s in %d bytes", v, what, len(d.p)-d.off)
		return 0
	}
	return int(v)
}

func (d *decoder) str(what string, max int) string {
	n := d.count(what+" bytes", max)
	return string(d.bytes(n))
}

func (d *decoder) ints(what string, max int) []int64 {
	n := d.count(what, max)
	if n == 0 {
		return nil
	}
	v := make([]int64, n)
	for i := range v {
		v[i] = d.varint(what)
	}
	return v
}

func (d *decoder) matrix(what string, rows, cols int) [][]int64 {
	n := d.count(what, rows)
	if n == 0 {
		return nil
	}
	m := make([][]int64, n)
	for i := range m {
		m[i] = d.ints(what, cols)
	}
	return m
}

func (d *decoder) ids(what string) []uint32 {
	n := d.count(what, MaxItems)
	if n == 0 {
		return nil
	}
	v := make([]uint32, n)
	for i := range v {
		x := d.uvarint(what)
		switch {
		case x == 0:
			v[i] = NoCacheID
		case x > MaxCacheIDs:
			d.fail("%s: id %d beyond %d", what, x-1, MaxCacheIDs)
		default:
			v[i] = uint32(x - 1)
		}
	}
	return v
}
