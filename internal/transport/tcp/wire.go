package tcp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// After auth.Handshake the dialer sends a hello naming the job, itself, whom it meant to reach and
// which lane the connection is; the acceptor answers with an ack (accepted, or why not). Then the
// connection carries either the raw striped byte stream (data lane) or length-prefixed messages
// (control lane). All integers are big-endian.
//
//	hello: "KOLOTCP1" | u8 lane | u16 stream | u16 streams | u32 from | u32 to | u32 size | u8 len | job id
//	ack:   u8 status (0 taken, 1 refused, 2 crossed) | u16 len | reason
//	msg:   u32 len | body

const (
	helloMagic    = "KOLOTCP1"
	helloFixedLen = len(helloMagic) + 1 + 2 + 2 + 4 + 4 + 4 + 1
	maxJobID      = 255
	maxReason     = 1024
	maxRanks      = 1 << 20
	// MaxStreams bounds Config.Streams (and what a hello may claim).
	MaxStreams = 64
	// MaxMsg is the largest control message the Messenger carries.
	MaxMsg = 64 << 20
	// msgReadStep bounds what a length prefix can make the reader allocate before bytes arrive.
	msgReadStep = 1 << 20
)

type lane uint8

const (
	laneControl lane = 0
	laneData    lane = 1
)

func (l lane) String() string {
	switch l {
	case laneControl:
		return "control"
	case laneData:
		return "data"
	}
	return fmt.Sprintf("lane(%d)", uint8(l))
}

type hello struct {
	lane    lane
	stream  int
	streams int
	from    int
	to      int
	size    int
	job     string
}

var errMalformed = errors.New("malformed tcp transport frame")

func (h hello) validate() error {
	switch {
	case h.lane != laneControl && h.lane != laneData:
		return fmt.Errorf("unknown %v", h.lane)
	case h.size < 1 || h.size > maxRanks:
		return fmt.Errorf("group size %d out of range", h.size)
	case h.from < 0 || h.from >= h.size || h.to < 0 || h.to >= h.size || h.from == h.to:
		return fmt.Errorf("ranks from %d to %d invalid in a group of %d", h.from, h.to, h.size)
	case h.streams < 1 || h.streams > MaxStreams:
		return fmt.Errorf("%d streams out of range", h.streams)
	case h.lane == laneData && h.stream >= h.streams, h.lane != laneData && h.stream != 0:
		return fmt.Errorf("%v stream %d of %d", h.lane, h.stream, h.streams)
	case len(h.job) > maxJobID:
		return fmt.Errorf("job id of %d bytes", len(h.job))
	}
	return nil
}

func appendHello(dst []byte, h hello) []byte {
	dst = append(dst, helloMagic...)
	dst = append(dst, byte(h.lane))
	dst = binary.BigEndian.AppendUint16(dst, uint16(h.stream))
	dst = binary.BigEndian.AppendUint16(dst, uint16(h.streams))
	dst = binary.BigEndian.AppendUint32(dst, uint32(h.from))
	dst = binary.BigEndian.AppendUint32(dst, uint32(h.to))
	dst = binary.BigEndian.AppendUint32(dst, uint32(h.size))
	dst = append(dst, byte(len(h.job)))
	return append(dst, h.job...)
}

func readHello(r io.Reader) (hello, error) {
	var b [helloFixedLen]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return hello{}, fmt.Errorf("read hello: %w", err)
	}
	if string(b[:len(helloMagic)]) != helloMagic {
		return hello{}, fmt.Errorf("%w: hello has a bad magic", errMalformed)
	}
	p := b[len(helloMagic):]
	h := hello{
		lane:    lane(p[0]),
		stream:  int(binary.BigEndian.Uint16(p[1:])),
		streams: int(binary.BigEndian.Uint16(p[3:])),
		from:    int(binary.BigEndian.Uint32(p[5:])),
		to:      int(binary.BigEndian.Uint32(p[9:])),
		size:    int(binary.BigEndian.Uint32(p[13:])),
	}
	job := make([]byte, p[17])
	if _, err := io.ReadFull(r, job); err != nil {
		return hello{}, fmt.Errorf("read hello job id: %w", err)
	}
	h.job = string(job)
	if err := h.validate(); err != nil {
		return hello{}, fmt.Errorf("%w: hello: %v", errMalformed, err)
	}
	return h, nil
}

// ack is the acceptor's answer to a hello; reason is empty when the connection was accepted.
func appendAck(dst []byte, reason string) []byte {
	status := byte(ackTaken)
	if reason != "" {
		status = ackRefused
	}
	return appendAckStatus(dst, status, reason)
}

// Ack statuses. ackCrossed answers a lazy mesh's dial that met the peer's own dial to this rank:
// the lower rank's set is the one both keep, so the higher rank drops its dial and waits.
const (
	ackTaken   = 0
	ackRefused = 1
	ackCrossed = 2
)

func appendAckStatus(dst []byte, status byte, reason string) []byte {
	if len(reason) > maxReason {
		reason = reason[:maxReason]
	}
	dst = append(dst, status)
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(reason)))
	return append(dst, reason...)
}

// errRejected marks a connection the acceptor refused after reading its hello: retrying cannot help.
var errRejected = errors.New("connection rejected by peer")

// errCrossed marks a dial the acceptor declined because it is dialing this rank itself (ackCrossed).
var errCrossed = errors.New("the peer is dialing this rank itself")

// declined says err is an ack that declined the connection (refused or crossed): the acceptor's
// answer, which dialing again cannot change.
func declined(err error) bool {
	return errors.Is(err, errRejected) || errors.Is(err, errCrossed)
}

// readAck returns nil if the acceptor took the connection, an error wrapping errRejected with its
// reason if it refused it, or the I/O or format error.
func readAck(r io.Reader) error {
	var b [3]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return fmt.Errorf("read ack: %w", err)
	}
	n := int(binary.BigEndian.Uint16(b[1:]))
	if b[0] > ackCrossed || n > maxReason || (b[0] == ackTaken) != (n == 0) {
		return fmt.Errorf("%w: ack status %d with %d-byte reason", errMalformed, b[0], n)
	}
	if n == 0 {
		return nil
	}
	reason := make([]byte, n)
	if _, err := io.ReadFull(r, reason); err != nil {
		return fmt.Errorf("read ack reason: %w", err)
	}
	if b[0] == ackCrossed {
		return fmt.Errorf("%w: %s", errCrossed, reason)
	}
	return fmt.Errorf("%w: %s", errRejected, reason)
}

// readMsg reads one control message. The body is never nil (an empty message is an empty slice), so
// that it is told apart from the nil Body that announces a lost peer.
func readMsg(r io.Reader) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := int(binary.BigEndian.Uint32(hdr[:]))
	if n > MaxMsg {
		return nil, fmt.Errorf("%w: message of %d bytes exceeds %d", errMalformed, n, MaxMsg)
	}
	body := make([]byte, min(n, msgReadStep))
	for got := 0; ; {
		if _, err := io.ReadFull(r, body[got:]); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, fmt.Errorf("read message body of %d bytes: %w", n, err)
		}
		got = len(body)
		if got == n {
			return body, nil
		}
		body = append(body, make([]byte, min(n-got, got))...)
	}
}

func appendMsg(dst, body []byte) []byte {
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(body)))
	return append(dst, body...)
}
