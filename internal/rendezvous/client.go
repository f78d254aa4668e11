package rendezvous

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/kolo-dl/kolo/internal/auth"
	"github.com/kolo-dl/kolo/internal/endpoint"
)

// Client is one authenticated connection to a Server. It is safe for concurrent use: calls are
// multiplexed over the connection by request id, so a Get parked on the server does not hold up
// other calls.
type Client struct {
	addr string
	conn net.Conn

	wmu sync.Mutex // serialises whole frames onto the connection
	w   *bufio.Writer
	hdr []byte

	mu      sync.Mutex
	nextID  uint64
	pending map[uint64]chan frame
	err     error         // set once the connection is gone; every later call returns it
	dead    chan struct{} // closed together with err being set
}

// Dial connects to the Server at addr and authenticates with secret. It retries (the launcher may
// not be listening yet) until ctx ends; a server that rejects the secret fails it at once.
func Dial(ctx context.Context, addr string, secret []byte) (*Client, error) {
	if len(secret) == 0 {
		return nil, fmt.Errorf("rendezvous dial %s: empty job secret", addr)
	}
	start := time.Now()
	backoff := 20 * time.Millisecond
	var lastErr error
	hungUp := 0
	for attempt := 1; ; attempt++ {
		conn, err := dialOnce(ctx, addr, secret)
		if err == nil {
			return newClient(addr, conn), nil
		}
		if errors.Is(err, auth.ErrDenied) {
			return nil, fmt.Errorf("rendezvous dial %s: %w", addr, err)
		}
		if errors.Is(err, errHungUp) {
			hungUp++
		} else {
			hungUp = 0
		}
		if hungUp == maxHangUps {
			return nil, fmt.Errorf("rendezvous dial %s: %w (inferred: the server hung up during authentication %d times in a row, last: %v)",
				addr, auth.ErrDenied, hungUp, err)
		}
		if lastErr == nil || ctx.Err() == nil {
			lastErr = err // an attempt cut short by ctx's end says less than the one before it
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("rendezvous dial %s: gave up after %d attempts in %s, last error: %v: %w",
				addr, attempt, time.Since(start).Round(time.Millisecond), lastErr, ctx.Err())
		case <-t.C:
		}
		backoff = min(2*backoff, time.Second)
	}
}

func dialOnce(ctx context.Context, addr string, secret []byte) (net.Conn, error) {
	conn, err := endpoint.Dial(ctx, addr)
	if err != nil {
		return nil, err
	}
	timeout := HandshakeTimeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(dl))
	}
	if err := auth.Handshake(conn, secret, auth.Dialer, timeout); err != nil {
		conn.Close()
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
			return nil, fmt.Errorf("%w: %w", errHungUp, err)
		}
		return nil, err
	}
	// Our proof checked out only when the server says so (server.go): until then it may still
	// time the handshake out. A denied client never gets here (the server's proof fails our
	// check), so a connection closed now is a busy server, not a denial: retried, not counted.
	conn.SetReadDeadline(time.Now().Add(timeout))
	var b [1]byte
	if _, err := io.ReadFull(conn, b[:]); err != nil || b[0] != acceptedByte {
		conn.Close()
		if err == nil {
			return nil, fmt.Errorf("authentication: the server answered %#x, not its acceptance: not a kolo rendezvous server of this version", b[0])
		}
		return nil, fmt.Errorf("authentication: the server did not confirm it (busy, or it timed the handshake out): %w", err)
	}
	conn.SetReadDeadline(time.Time{})
	if tc, ok := conn.(*net.TCPConn); ok {
		tc.SetKeepAliveConfig(net.KeepAliveConfig{Enable: true, Idle: 5 * time.Second, Interval: 2 * time.Second, Count: 5})
	}
	return conn, nil
}

// errHungUp marks a handshake the server ended by closing the connection. auth.Handshake's
// listener side may close before its own proof is out, so a client with the wrong secret can see
// EOF instead of auth.ErrDenied; a few of those in a row are taken as a denial rather than retried
// until ctx ends.
var errHungUp = errors.New("server hung up during authentication")

const maxHangUps = 3

// acceptedByte is the server's word, after the handshake, that it accepted the connection.
const acceptedByte = 0xA5

func newClient(addr string, conn net.Conn) *Client {
	c := &Client{
		addr:    addr,
		conn:    conn,
		w:       bufio.NewWriterSize(conn, 64<<10),
		pending: map[uint64]chan frame{},
		dead:    make(chan struct{}),
	}
	go c.readLoop()
	return c
}

func (c *Client) readLoop() {
	r := bufio.NewReaderSize(c.conn, 64<<10)
	for {
		f, err := readFrame(r)
		if err != nil {
			c.fail(fmt.Errorf("connection lost: %w", err))
			return
		}
		c.mu.Lock()
		ch := c.pending[f.id]
		delete(c.pending, f.id)
		c.mu.Unlock()
		if ch != nil {
			ch <- f // buffered: never blocks
		}
	}
}

// fail records why the connection is unusable and wakes every pending call.
func (c *Client) fail(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
		close(c.dead)
	}
	c.mu.Unlock()
	c.conn.Close()
}

// LocalAddr is this end of the connection: its IP is an address of this host that reaches the
// rendezvous, so workers advertise it to peers.
func (c *Client) LocalAddr() net.Addr { return c.conn.LocalAddr() }

// Close drops the connection; pending and later calls fail with ErrClosed.
func (c *Client) Close() error {
	c.fail(ErrClosed)
	return nil
}

// Set stores value under key.
func (c *Client) Set(ctx context.Context, key string, value []byte) error {
	if err := checkSizes(key, value); err != nil {
		return fmt.Errorf("rendezvous %s: set: %w", c.addr, err)
	}
	f, err := c.call(ctx, verbSet, key, value)
	if err != nil {
		return fmt.Errorf("rendezvous %s: set %q: %w", c.addr, key, err)
	}
	if f.verb != verbOK {
		return c.unexpected("set", key, f)
	}
	return nil
}

// SetSession sets key to value for as long as this client's connection lasts: when the
// connection ends (Close, the process's death, or the server giving up on a peer that stopped
// answering: Server.SetLiveness), the server deletes the key, unless a later write replaced its
// value. Presence records use it: the key says its writer can still be reached.
func (c *Client) SetSession(ctx context.Context, key string, value []byte) error {
	if err := checkSizes(key, value); err != nil {
		return fmt.Errorf("rendezvous %s: setsession: %w", c.addr, err)
	}
	f, err := c.call(ctx, verbSetSession, key, value)
	if err != nil {
		return fmt.Errorf("rendezvous %s: setsession %q: %w", c.addr, key, err)
	}
	if f.verb != verbOK {
		return c.unexpected("setsession", key, f)
	}
	return nil
}

// SetIfAbsent stores value under key only if key is not set, and reports whether it did (see
// Store.SetIfAbsent).
func (c *Client) SetIfAbsent(ctx context.Context, key string, value []byte) (stored bool, err error) {
	if err := checkSizes(key, value); err != nil {
		return false, fmt.Errorf("rendezvous %s: setifabsent: %w", c.addr, err)
	}
	f, err := c.call(ctx, verbSetIfAbsent, key, value)
	if err != nil {
		return false, fmt.Errorf("rendezvous %s: setifabsent %q: %w", c.addr, key, err)
	}
	if f.verb != verbValue || len(f.value) != 1 || f.value[0] > 1 {
		return false, c.unexpected("setifabsent", key, f)
	}
	return f.value[0] == 1, nil
}

// Get returns key's value, waiting on the server until some client sets it or ctx ends.
func (c *Client) Get(ctx context.Context, key string) ([]byte, error) {
	if err := checkSizes(key, nil); err != nil {
		return nil, fmt.Errorf("rendezvous %s: get: %w", c.addr, err)
	}
	start := time.Now()
	f, err := c.call(ctx, verbGet, key, nil)
	if err != nil {
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return nil, fmt.Errorf("rendezvous %s: waited %s for key %q: %w", c.addr, time.Since(start).Round(time.Millisecond), key, err)
		}
		return nil, fmt.Errorf("rendezvous %s: waiting for key %q: %w", c.addr, key, err)
	}
	if f.verb != verbValue {
		return nil, c.unexpected("get", key, f)
	}
	return f.value, nil
}

// Gather is Store.Gather over the connection: one request, answered once all n members have
// sent theirs.
func (c *Client) Gather(ctx context.Context, key string, n, i int, value []byte) ([][]byte, error) {
	if err := checkSizes(key, value); err != nil {
		return nil, fmt.Errorf("rendezvous %s: gather: %w", c.addr, err)
	}
	if n < 1 || n > maxGather || i < 0 || i >= n {
		return nil, fmt.Errorf("rendezvous %s: gather %q: member %d of %d is out of range", c.addr, key, i, n)
	}
	start := time.Now()
	req := make([]byte, 8, 8+len(value))
	binary.BigEndian.PutUint32(req, uint32(n))
	binary.BigEndian.PutUint32(req[4:], uint32(i))
	f, err := c.call(ctx, verbGather, key, append(req, value...))
	if err != nil {
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return nil, fmt.Errorf("rendezvous %s: waited %s for the %d members of gather %q: %w", c.addr, time.Since(start).Round(time.Millisecond), n, key, err)
		}
		return nil, fmt.Errorf("rendezvous %s: gather %q: %w", c.addr, key, err)
	}
	if f.verb == verbError && bytes.Contains(f.value, []byte(gatherMismatch)) {
		return nil, fmt.Errorf("rendezvous %s: gather %q: %w: %s", c.addr, key, ErrGatherMismatch, f.value)
	}
	if f.verb != verbValue {
		return nil, c.unexpected("gather", key, f)
	}
	vals, err := DecodeTable(f.value, n)
	if err != nil {
		return nil, fmt.Errorf("rendezvous %s: gather %q: %w", c.addr, key, err)
	}
	return vals, nil
}

// TryGet returns key's value without waiting; ok is false when it is not set.
func (c *Client) TryGet(ctx context.Context, key string) (value []byte, ok bool, err error) {
	if err := checkSizes(key, nil); err != nil {
		return nil, false, fmt.Errorf("rendezvous %s: tryget: %w", c.addr, err)
	}
	f, err := c.call(ctx, verbTryGet, key, nil)
	if err != nil {
		return nil, false, fmt.Errorf("rendezvous %s: tryget %q: %w", c.addr, key, err)
	}
	switch f.verb {
	case verbValue:
		return f.value, true, nil
	case verbMissing:
		return nil, false, nil
	}
	return nil, false, c.unexpected("tryget", key, f)
}

// Add atomically adds delta to the counter at key (missing counts as 0) and returns the new value.
func (c *Client) Add(ctx context.Context, key string, delta int64) (int64, error) {
	if err := checkSizes(key, nil); err != nil {
		return 0, fmt.Errorf("rendezvous %s: add: %w", c.addr, err)
	}
	f, err := c.call(ctx, verbAdd, key, binary.BigEndian.AppendUint64(nil, uint64(delta)))
	if err != nil {
		return 0, fmt.Errorf("rendezvous %s: add %q: %w", c.addr, key, err)
	}
	if f.verb != verbValue || len(f.value) != 8 {
		return 0, c.unexpected("add", key, f)
	}
	return int64(binary.BigEndian.Uint64(f.value)), nil
}

func (c *Client) unexpected(op, key string, f frame) error {
	if f.verb == verbError {
		return fmt.Errorf("rendezvous %s: %s %q: server: %s", c.addr, op, key, f.value)
	}
	return fmt.Errorf("rendezvous %s: %s %q: unexpected %v response with %d-byte value", c.addr, op, key, f.verb, len(f.value))
}

// call sends one request and waits for its response, the connection's loss, or ctx's end.
func (c *Client) call(ctx context.Context, v verb, key string, value []byte) (frame, error) {
	if err := ctx.Err(); err != nil {
		return frame{}, err
	}
	ch := make(chan frame, 1)
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return frame{}, err
	}
	c.nextID++
	id := c.nextID
	c.pending[id] = ch
	c.mu.Unlock()

	if err := c.send(ctx, frame{id: id, verb: v, key: key, value: value}); err != nil {
		c.forget(id)
		return frame{}, err
	}
	select {
	case f := <-ch:
		return f, nil
	case <-c.dead:
		return frame{}, c.err // set before dead was closed
	case <-ctx.Done():
		if c.forget(id) && (v == verbGet || v == verbGather) {
			// Unpark it on the server; if this fails the connection is gone and so is the waiter.
			c.send(context.Background(), frame{id: id, verb: verbCancel, key: key})
		}
		return frame{}, ctx.Err()
	}
}

// forget drops a pending call and reports whether it was still pending.
func (c *Client) forget(id uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.pending[id]
	delete(c.pending, id)
	return ok
}

// send writes one whole frame. A write that fails part way leaves the stream out of step, so any
// write error ends the connection for every caller.
func (c *Client) send(ctx context.Context, f frame) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	select {
	case <-c.dead:
		return c.err
	default:
	}
	// The server always reads, so a write only stalls when the server host does; bound it by ctx.
	if dl, ok := ctx.Deadline(); ok {
		c.conn.SetWriteDeadline(dl)
		defer c.conn.SetWriteDeadline(time.Time{})
	}
	c.hdr = appendHeader(c.hdr[:0], f)
	c.w.Write(c.hdr)
	c.w.Write(f.value)
	if err := c.w.Flush(); err != nil {
		err = fmt.Errorf("connection lost: send %v: %w", f.verb, err)
		c.fail(err)
		return err
	}
	return nil
}
