package shm

import (
	"encoding/binary"
	"fmt"
)

// Messenger frames on a msg ring: a 4-byte little-endian body length, then the body. A frame may
// be longer than the ring; the reader then receives it in pieces and the decoder reassembles it.

const (
	frameHeaderBytes = 4
	// maxMsgBytes bounds a frame's length so a corrupt header cannot make the reader allocate
	// gigabytes: control messages are small, and 256 MiB is far beyond any negotiation message.
	maxMsgBytes = 256 << 20
)

func putFrameHeader(dst []byte, n int) { binary.LittleEndian.PutUint32(dst, uint32(n)) }

// frameDecoder reassembles frames from a byte stream fed in arbitrary pieces.
type frameDecoder struct {
	hdr  [frameHeaderBytes]byte
	nhdr int    // header bytes seen of the current frame
	want int    // body length of the current frame, once the header is complete
	body []byte // body bytes so far; grown as they arrive, so a bad length costs no memory
}

// feed consumes all of p, calling emit with each completed body (a fresh slice the callee owns;
// never nil, so an empty message is distinguishable from Messenger's nil "peer lost" marker). It
// fails on a length above maxMsgBytes: the stream is then corrupt and the decoder unusable.
func (d *frameDecoder) feed(p []byte, emit func([]byte)) error {
	for len(p) > 0 {
		if d.nhdr < frameHeaderBytes {
			n := copy(d.hdr[d.nhdr:], p)
			d.nhdr += n
			p = p[n:]
			if d.nhdr < frameHeaderBytes {
				return nil
			}
			size := binary.LittleEndian.Uint32(d.hdr[:])
			if size > maxMsgBytes {
				return fmt.Errorf("frame of %d bytes exceeds the %d-byte limit: stream corrupt", size, maxMsgBytes)
			}
			d.want = int(size)
			d.body = make([]byte, 0, min(d.want, 64<<10))
		}
		n := min(d.want-len(d.body), len(p))
		d.body = append(d.body, p[:n]...)
		p = p[n:]
		if len(d.body) == d.want {
			body := d.body
			d.body, d.nhdr, d.want = nil, 0, 0
			emit(body)
		}
	}
	return nil
}

// midFrame reports whether the decoder holds part of a frame (a peer lost now lost a message).
func (d *frameDecoder) midFrame() bool { return d.nhdr > 0 }
