package rendezvous

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Wire format: every request and every response is one frame
//
//	u32 body length | u64 request id | u8 verb | u16 key length | key | value
//
// all big-endian. The value is whatever follows the key up to the end of the body. Responses carry
// the id of the request they answer, an empty key, and a response verb.

const (
	// MaxKey is the longest key the store accepts.
	MaxKey = 4 << 10
	// MaxValue is the largest value the store accepts.
	MaxValue = 64 << 20

	headerLen  = 4         // the body length prefix
	fixedLen   = 8 + 1 + 2 // id, verb, key length
	maxBodyLen = fixedLen + MaxKey + MaxValue
	// readStep bounds what a frame header can make us allocate before its bytes actually arrive.
	readStep = 1 << 20
)

type verb byte

const (
	// Requests.
	verbSet    verb = 1
	verbGet    verb = 2 // parks until the key exists
	verbTryGet verb = 3
	verbAdd    verb = 4 // value: 8-byte delta; answer: 8-byte new value
	verbCancel verb = 5 // abandons a parked Get with the same id; never answered
	// verbSetIfAbsent sets the key only if it is not set; answer: a 1-byte value, 1 if it did.
	verbSetIfAbsent verb = 6
	// verbGather is Store.Gather; value: u32 members | u32 index | the member's value; answer: the
	// encoded table, once every member has arrived (parks as a Get does; cancelled the same way).
	verbGather verb = 7
	// verbSetSession is verbSet for a record that lasts as long as the connection that set it:
	// when the connection ends (the client closed it, or it died), the server deletes the key,
	// unless a later write replaced the value.
	verbSetSession verb = 8

	// Responses.
	verbOK      verb = 0x81
	verbValue   verb = 0x82
	verbMissing verb = 0x83
	verbError   verb = 0x84 // value: a message
)

func (v verb) String() string {
	switch v {
	case verbSet:
		return "set"
	case verbGet:
		return "get"
	case verbTryGet:
		return "tryget"
	case verbAdd:
		return "add"
	case verbCancel:
		return "cancel"
	case verbSetIfAbsent:
		return "setifabsent"
	case verbGather:
		return "gather"
	case verbSetSession:
		return "setsession"
	case verbOK:
		return "ok"
	case verbValue:
		return "value"
	case verbMissing:
		return "missing"
	case verbError:
		return "error"
	}
	return fmt.Sprintf("verb(%d)", byte(v))
}

type frame struct {
	id    uint64
	verb  verb
	key   string
	value []byte
}

// errFrame marks a frame that breaks the format: the connection it came from cannot be trusted to
// stay in step and is closed.
var errFrame = errors.New("malformed rendezvous frame")

// appendHeader appends everything of f except its value, so that a large value can be written from
// where it already lies instead of being copied into the frame.
func appendHeader(dst []byte, f frame) []byte {
	body := fixedLen + len(f.key) + len(f.value)
	dst = binary.BigEndian.AppendUint32(dst, uint32(body))
	dst = binary.BigEndian.AppendUint64(dst, f.id)
	dst = append(dst, byte(f.verb))
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(f.key)))
	return append(dst, f.key...)
}

func checkSizes(key string, value []byte) error {
	if len(key) > MaxKey {
		return fmt.Errorf("key of %d bytes is longer than the %d allowed", len(key), MaxKey)
	}
	if len(value) > MaxValue {
		return fmt.Errorf("value of %d bytes for key %q is larger than the %d allowed", len(value), key, MaxValue)
	}
	return nil
}

// decodeBody parses a frame body (everything after the length prefix).
func decodeBody(b []byte) (frame, error) {
	if len(b) < fixedLen {
		return frame{}, fmt.Errorf("%w: body of %d bytes is shorter than the %d-byte header", errFrame, len(b), fixedLen)
	}
	f := frame{id: binary.BigEndian.Uint64(b), verb: verb(b[8])}
	klen := int(binary.BigEndian.Uint16(b[9:]))
	if klen > MaxKey {
		return frame{}, fmt.Errorf("%w: key length %d exceeds %d", errFrame, klen, MaxKey)
	}
	rest := b[fixedLen:]
	if klen > len(rest) {
		return frame{}, fmt.Errorf("%w: key length %d but only %d bytes follow", errFrame, klen, len(rest))
	}
	f.key = string(rest[:klen])
	f.value = rest[klen:]
	if len(f.value) > MaxValue {
		return frame{}, fmt.Errorf("%w: value of %d bytes exceeds %d", errFrame, len(f.value), MaxValue)
	}
	return f, nil
}

// readFrame reads one frame. It never allocates much more than the bytes that actually arrived, so
// a peer announcing a 64 MiB frame and then stalling costs at most readStep.
func readFrame(r io.Reader) (frame, error) {
	var hdr [headerLen]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return frame{}, err
	}
	n := int(binary.BigEndian.Uint32(hdr[:]))
	if n < fixedLen || n > maxBodyLen {
		return frame{}, fmt.Errorf("%w: body length %d outside [%d, %d]", errFrame, n, fixedLen, maxBodyLen)
	}
	body := make([]byte, min(n, readStep))
	for got := 0; ; {
		if _, err := io.ReadFull(r, body[got:]); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return frame{}, fmt.Errorf("read frame body of %d bytes: %w", n, err)
		}
		got = len(body)
		if got == n {
			break
		}
		body = append(body, make([]byte, min(n-got, got))...)
	}
	return decodeBody(body)
}
