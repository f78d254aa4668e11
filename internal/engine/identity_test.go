package engine

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kolo-dl/kolo/internal/dtype"
	"github.com/kolo-dl/kolo/internal/reduce"
)

// fillIdentity must give, for every dtype and op, a value that leaves the others' reduction unchanged
// (what a joined rank contributes): x op identity == x for every x, including the type's extremes.
func TestFillIdentityChangesNothing(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 9))
	for _, typ := range dtype.All {
		for _, op := range []reduce.Op{reduce.Sum, reduce.Min, reduce.Max, reduce.Prod} {
			x := identitySamples(rng, typ)
			got := append([]byte(nil), x...)
			id := make([]byte, len(x))
			fillIdentity(id, typ, op)
			reduce.Into(typ, op, got, id)
			if string(got) != string(x) {
				t.Errorf("%v %v: x op identity changed x:\n got %x\nwant %x", typ, op, got, x)
			}
		}
	}
}

// The identities of a narrow signed type are its extremes, not the wider types' truncated.
func TestIdentityInt16(t *testing.T) {
	for op, want := range map[reduce.Op]int16{reduce.Prod: 1, reduce.Min: math.MaxInt16, reduce.Max: math.MinInt16} {
		if got := int16(binary.LittleEndian.Uint16(identity(dtype.Int16, op))); got != want {
			t.Errorf("identity(int16, %v) = %d, want %d", op, got, want)
		}
	}
}

// identitySamples returns 67 elements of t (vectors and a tail): for integers the extremes, 0, ±1
// and random bits; for floats ±Inf, the largest finite values and random moderate values (no -0,
// which x + 0 turns into +0, and no NaN, whose payload may be quieted).
func identitySamples(rng *rand.Rand, t dtype.DType) []byte {
	const n = 67
	es := t.Size()
	b := make([]byte, n*es)
	le := binary.LittleEndian
	for i := range n {
		p, r := b[i*es:], rng.Uint64()
		switch t {
		case dtype.Uint8, dtype.Int8, dtype.Int16, dtype.Int32, dtype.Int64:
			edges := []uint64{0, 1, math.MaxUint64, 1 << (8*es - 1), 1<<(8*es-1) - 1, math.MaxUint64 >> (64 - 8*es)}
			if i < len(edges) {
				r = edges[i]
			}
			for k := range es {
				p[k] = byte(r >> (8 * k))
			}
			continue
		}
		edges := []float64{math.Inf(1), math.Inf(-1), 1, -1}
		v := float64(int32(r)) * 0x1p-16
		if i < len(edges) {
			v = edges[i]
		}
		switch t {
		case dtype.Float16:
			le.PutUint16(p, reduce.Float32ToFloat16Bits(float32(v)))
		case dtype.BFloat16:
			le.PutUint16(p, reduce.Float32ToBFloat16Bits(float32(v)))
		case dtype.Float32:
			le.PutUint32(p, math.Float32bits(float32(v)))
		case dtype.Float64:
			le.PutUint64(p, math.Float64bits(v))
		default:
			panic("identitySamples: no samples for " + t.String())
		}
	}
	return b
}
