package tcp

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func TestWireRoundTrip(t *testing.T) {
	hellos := []hello{
		{lane: laneControl, streams: 1, from: 0, to: 1, size: 2, job: ""},
		{lane: laneData, stream: 63, streams: 64, from: 7, to: 3, size: 8, job: strings.Repeat("j", maxJobID)},
	}
	for _, h := range hellos {
		wire := appendHello(nil, h)
		got, err := readHello(bytes.NewReader(wire))
		if err != nil || got != h {
			t.Fatalf("hello %+v came back as %+v, %v", h, got, err)
		}
		for cut := range len(wire) {
			if _, err := readHello(bytes.NewReader(wire[:cut])); err == nil {
				t.Fatalf("hello cut to %d of %d bytes decoded", cut, len(wire))
			}
		}
	}
	bad := []hello{
		{lane: 2, streams: 1, from: 0, to: 1, size: 2},
		{lane: laneData, stream: 2, streams: 2, from: 0, to: 1, size: 2},
		{lane: laneControl, stream: 1, streams: 2, from: 0, to: 1, size: 2},
		{lane: laneControl, streams: 1, from: 1, to: 1, size: 2},
		{lane: laneControl, streams: 1, from: 0, to: 2, size: 2},
		{lane: laneControl, streams: 0, from: 0, to: 1, size: 2},
		{lane: laneControl, streams: MaxStreams + 1, from: 0, to: 1, size: 2},
	}
	for _, h := range bad {
		if _, err := readHello(bytes.NewReader(appendHello(nil, h))); !errors.Is(err, errMalformed) {
			t.Errorf("invalid hello %+v: %v", h, err)
		}
	}

	for _, reason := range []string{"", "job id mismatch", strings.Repeat("x", maxReason+10)} {
		err := readAck(bytes.NewReader(appendAck(nil, reason)))
		switch {
		case reason == "" && err != nil:
			t.Fatalf("ok ack: %v", err)
		case reason != "" && (!errors.Is(err, errRejected) || !strings.Contains(err.Error(), reason[:min(len(reason), maxReason)])):
			t.Fatalf("reject ack %q: %v", reason[:min(20, len(reason))], err)
		}
	}

	for _, n := range []int{0, 1, msgReadStep - 1, msgReadStep, 3*msgReadStep + 5} {
		body := bytes.Repeat([]byte{0xa5}, n)
		wire := appendMsg(nil, body)
		got, err := readMsg(bytes.NewReader(wire))
		if err != nil || got == nil || !bytes.Equal(got, body) {
			t.Fatalf("message of %d bytes: got %d bytes (nil %v), %v", n, len(got), got == nil, err)
		}
		if _, err := readMsg(bytes.NewReader(wire[:len(wire)-1])); n > 0 && err == nil {
			t.Fatalf("message of %d bytes cut by one decoded", n)
		}
	}
	for _, hdr := range [][]byte{{0xff, 0xff, 0xff, 0xfe}, {0xff, 0xff, 0xff, 0xff, 1, 2}} {
		if _, err := readMsg(bytes.NewReader(hdr)); !errors.Is(err, errMalformed) {
			t.Fatalf("4 GiB message header % x: %v", hdr[:4], err)
		}
	}
}

func FuzzReadHello(f *testing.F) {
	f.Add(appendHello(nil, hello{lane: laneData, stream: 1, streams: 2, from: 0, to: 3, size: 4, job: "job"}))
	f.Add([]byte(helloMagic + "\x01\x00\x00\x00\x02\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x02\xff"))
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bytes.NewReader(data)
		h, err := readHello(r)
		if err != nil {
			return
		}
		if err := h.validate(); err != nil {
			t.Fatalf("readHello returned an invalid hello: %v", err)
		}
		if re := appendHello(nil, h); !bytes.Equal(re, data[:len(data)-r.Len()]) {
			t.Fatal("re-encoded hello differs from the bytes read")
		}
	})
}

func FuzzReadAck(f *testing.F) {
	f.Add(appendAck(nil, ""))
	f.Add(appendAck(nil, "nope"))
	f.Add([]byte{1, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bytes.NewReader(data)
		err := readAck(r)
		if err == nil && (len(data) < 3 || data[0] != 0) {
			t.Fatalf("ack %x accepted", data)
		}
		if errors.Is(err, errRejected) && len(data)-r.Len() > 3+maxReason {
			t.Fatalf("ack read %d bytes", len(data)-r.Len())
		}
	})
}

func FuzzReadMsg(f *testing.F) {
	f.Add(appendMsg(nil, []byte("hello")))
	f.Add(appendMsg(nil, nil))
	f.Add([]byte{0x03, 0xff, 0xff, 0xff, 1, 2})
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bytes.NewReader(data)
		body, err := readMsg(r)
		if err != nil {
			return
		}
		if body == nil {
			t.Fatal("decoded message has a nil body")
		}
		if !bytes.Equal(appendMsg(nil, body), data[:len(data)-r.Len()]) {
			t.Fatal("re-encoded message differs from the bytes read")
		}
	})
}
