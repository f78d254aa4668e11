package shm

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"testing"
)

// decodeWhole is the reference decoder: it parses a complete stream in one pass, returning the
// bodies of every complete frame and whether it hit a length over the limit.
func decodeWhole(stream []byte) (bodies [][]byte, bad bool) {
	for len(stream) >= frameHeaderBytes {
		n := binary.LittleEndian.Uint32(stream)
		if n > maxMsgBytes {
			return bodies, true
		}
		if uint64(len(stream)-frameHeaderBytes) < uint64(n) {
			break
		}
		bodies = append(bodies, stream[frameHeaderBytes:frameHeaderBytes+int(n)])
		stream = stream[frameHeaderBytes+int(n):]
	}
	return bodies, false
}

// decodePieces feeds stream to a frameDecoder in pieces cut at the given sizes.
func decodePieces(stream []byte, cuts []byte) (bodies [][]byte, bad bool) {
	var d frameDecoder
	emit := func(b []byte) {
		if b == nil {
			panic("decoder emitted a nil body")
		}
		bodies = append(bodies, b)
	}
	for i := 0; len(stream) > 0; i++ {
		n := len(stream)
		if len(cuts) > 0 {
			n = min(n, int(cuts[i%len(cuts)]))
		}
		if err := d.feed(stream[:n], emit); err != nil {
			return bodies, true
		}
		stream = stream[n:]
	}
	return bodies, false
}

func frames(bodies ...[]byte) []byte {
	var s []byte
	for _, b := range bodies {
		s = binary.LittleEndian.AppendUint32(s, uint32(len(b)))
		s = append(s, b...)
	}
	return s
}

func checkDecoder(t *testing.T, stream, cuts []byte) {
	want, wantBad := decodeWhole(stream)
	got, gotBad := decodePieces(stream, cuts)
	if gotBad != wantBad || len(got) != len(want) {
		t.Fatalf("cuts %v: got %d messages (bad %v), want %d (bad %v)", cuts, len(got), gotBad, len(want), wantBad)
	}
	for i := range want {
		if !bytes.Equal(got[i], want[i]) {
			t.Fatalf("cuts %v: message %d differs", cuts, i)
		}
	}
}

func TestFrameDecoder(t *testing.T) {
	big := bytes.Repeat([]byte("x"), 70000)
	huge := binary.LittleEndian.AppendUint32(nil, maxMsgBytes+1)
	for i, tc := range []struct {
		stream []byte
		cuts   []byte
	}{
		{frames(), nil},
		{frames([]byte{}), nil},
		{frames([]byte{}, []byte{}, []byte("a")), []byte{1}},
		{frames([]byte("hello"), []byte{}, big, []byte("z")), []byte{3, 1, 250, 2}},
		{frames([]byte("partial"))[:9], []byte{2}},
		{append(frames([]byte("ok")), huge...), []byte{5}},
		{frames(big), []byte{4}},
	} {
		t.Run(fmt.Sprint(i), func(t *testing.T) { checkDecoder(t, tc.stream, tc.cuts) })
	}
}

func FuzzFrameDecoder(f *testing.F) {
	f.Add(frames([]byte("hello"), []byte{}, []byte("x")), []byte{1, 3})
	f.Add(binary.LittleEndian.AppendUint32(nil, maxMsgBytes+1), []byte{2})
	f.Add([]byte{0, 0, 0}, []byte{})
	f.Fuzz(func(t *testing.T, stream, cuts []byte) {
		for i := range cuts {
			cuts[i] = max(cuts[i], 1)
		}
		checkDecoder(t, stream, cuts)
	})
}
