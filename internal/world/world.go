// Package world connects one worker process to the rest of its job: it meets the other ranks at the
// rendezvous, opens the shared-memory group of its host, dials TCP to the ranks of other hosts, and
// hands the engine one routed group plus the host-local and cross-host sub-groups that hierarchical
// algorithms use.
//
// It owns connection set-up and tear-down only. It must not run collectives or know about tensors.
package world

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/kolo-dl/kolo/internal/endpoint"
	"github.com/kolo-dl/kolo/internal/jobenv"
	"github.com/kolo-dl/kolo/internal/netif"
	"github.com/kolo-dl/kolo/internal/rendezvous"
	"github.com/kolo-dl/kolo/internal/transport"
	"github.com/kolo-dl/kolo/internal/transport/inmem"
	"github.com/kolo-dl/kolo/internal/transport/shm"
	"github.com/kolo-dl/kolo/internal/transport/tcp"
)

// Options tune set-up. Zero values mean the defaults.
type Options struct {
	Timeout      time.Duration // for the whole set-up (rendezvous, attach, connect); default 60 s
	TCPStreams   int           // data connections per remote peer; default 2
	ShmSlotBytes int           // per-rank shared slot; default shm's (8 MiB up to 24 local ranks, then less)
	ShmDir       string        // default /dev/shm
	NoShm        bool          // force TCP even between ranks of one host
	// ShmSpin is how long shared-memory waits spin before they sleep (shm.Config.Spin): 0 for
	// the transport's default, negative never to spin. kolo.Init sets it from KOLO_SPIN_TIME, so
	// one knob governs every spin of a rank.
	ShmSpin time.Duration
	// Interface names the network interface(s) whose address this rank listens on and advertises to
	// its peers (comma-separated: the first one present here is used; kolo run --network-interface,
	// KOLO_NETWORK_INTERFACE). Empty: the address this rank reaches the rendezvous from (loopback in
	// a job on one host). A rank listens on that one address only, never on every interface: a
	// stranger on another network cannot reach its port.
	Interface string
	// ProgressTimeout is the transports' progress deadline (tcp.Config and shm.Config's): a
	// collective's transfer that waits this long on a peer that moves nothing fails with a
	// *transport.StallError. 0: transport.DefaultProgressTimeout; negative: never. kolo.Init sets
	// it from engine.Config.ProgressTimeout (KOLO_PROGRESS_TIMEOUT_SECONDS).
	ProgressTimeout time.Duration
	// FullMesh connects every rank of another host at Connect, as before lazy meshes
	// (KOLO_TCP_FULL_MESH=1). By default Connect connects only the remote ranks the collectives
	// use at once (eagerPeers), and the others on first use.
	FullMesh bool
}

// World is this process's view of the job once connected.
type World struct {
	Job   jobenv.Job
	Hosts []string // Hosts[r] = host name of rank r

	Comm       transport.Comm      // every rank of the job
	Messenger  transport.Messenger // every rank of the job
	Local      transport.Comm      // ranks of this host, in rank order (shared memory when possible)
	Cross      transport.Comm      // one rank per host with this LocalRank; nil unless every host has the same number of ranks
	LocalRanks []int               // job ranks of Local, in order
	// Rendezvous is this world's connection to the job's rendezvous, open until the world closes
	// (nil in a world of one): the worker publishes its reports for the launcher through it.
	Rendezvous *rendezvous.Client

	closers []func() error
	shm     *shm.Group
	mesh    *tcp.Mesh
	ln      *tcp.Listener // where the peers dial this rank
}

// Connect builds the World of job. A job of size 1 needs no rendezvous.
func Connect(ctx context.Context, job jobenv.Job, secret []byte, opt Options) (*World, error) {
	if opt.Timeout <= 0 {
		opt.Timeout = 60 * time.Second
	}
	if opt.TCPStreams <= 0 {
		opt.TCPStreams = 2
	}
	var ifaceIP net.IP
	if opt.Interface != "" && job.Size > 1 {
		ip, _, err := netif.InterfaceIP(opt.Interface)
		if err != nil {
			return nil, fmt.Errorf("rank %d: %w", job.Rank, err)
		}
		ifaceIP = ip
	}
	ctx, cancel := context.WithTimeout(ctx, opt.Timeout)
	defer cancel()

	if job.Size == 1 {
		// Alone (a launcher's job of one, or WithRanks of one rank): its own host and cross group.
		job.LocalRank, job.LocalSize, job.CrossRank, job.CrossSize = 0, 1, 0, 1
		ep := inmem.New(1)[0]
		return &World{Job: job, Hosts: []string{job.Hostname}, Comm: ep, Messenger: ep, Local: ep,
			LocalRanks: []int{0}, closers: []func() error{ep.Close}}, nil
	}
	w := &World{Job: job}
	ok := false
	defer func() {
		if !ok {
			w.Close()
		}
	}()

	rv, err := rendezvous.Dial(ctx, job.Rendezvous, secret)
	if err != nil {
		return nil, fmt.Errorf("rank %d: reach rendezvous %s: %w", job.Rank, job.Rendezvous, err)
	}
	w.closers = append(w.closers, rv.Close)
	w.Rendezvous = rv

	at, err := listenAddr(job, rv.LocalAddr(), ifaceIP)
	if err != nil {
		return nil, fmt.Errorf("rank %d: %w", job.Rank, err)
	}
	ln, err := tcp.Listen(at, secret)
	if err != nil {
		return nil, fmt.Errorf("rank %d: listen for peers: %w", job.Rank, err)
	}
	w.ln = ln
	w.closers = append(w.closers, ln.Close)
	addr := ln.Addr().String()

	// Every rank publishes where it listens and which host it is on and gets everyone's back, in
	// one request (the rendezvous answers once all ranks have sent theirs): start-up costs the
	// server n requests, not n².
	me := fmt.Sprintf("%s|%s|%s", addr, job.Hostname, bootID())
	table, err := rv.Gather(ctx, recordsKey(job.JobID), job.Size, job.Rank, []byte(me))
	if err != nil {
		return nil, fmt.Errorf("rank %d: publish its address and wait for the other %d ranks': %w", job.Rank, job.Size-1, err)
	}
	addrs := make([]string, job.Size)
	w.Hosts = make([]string, job.Size)
	boots := make([]string, job.Size)
	for r, v := range table {
		parts := strings.SplitN(string(v), "|", 3)
		if len(parts) != 3 {
			return nil, fmt.Errorf("rank %d: malformed address record of rank %d: %q", job.Rank, r, v)
		}
		addrs[r], w.Hosts[r], boots[r] = parts[0], parts[1], parts[2]
	}

	if job.LocalSize == 0 { // a subset of the launcher's job (kolo.WithRanks): known now
		for r, h := range w.Hosts {
			if h == job.Hostname {
				if r == job.Rank {
					job.LocalRank = job.LocalSize
				}
				job.LocalSize++
			}
		}
		job.CrossSize = 0
		w.Job = job
	}
	if job.CrossSize == 0 { // the launcher (mpirun) could not say; every rank's host is known now
		job.CrossRank, job.CrossSize = jobenv.CrossFromHosts(w.Hosts, job.Hostname, job.LocalRank)
		w.Job = job
	}

	// Ranks with the same host name share memory. Check the launcher's numbers agree.
	var local []int
	for r, h := range w.Hosts {
		if h == job.Hostname {
			local = append(local, r)
			if boots[r] != boots[job.Rank] {
				return nil, fmt.Errorf("ranks %d and %d both claim host %q but run on different machines (boot ids differ); give each machine a distinct host name", job.Rank, r, h)
			}
		}
	}
	w.LocalRanks = local
	if len(local) != job.LocalSize || local[job.LocalRank] != job.Rank {
		return nil, fmt.Errorf("rank %d: launcher says local rank %d of %d on %q, but ranks %v published that host", job.Rank, job.LocalRank, job.LocalSize, job.Hostname, local)
	}

	links := make([]transport.Link, job.Size)
	var remote []int
	isLocal := map[int]int{}
	for i, r := range local {
		isLocal[r] = i
	}
	for r := range job.Size {
		if _, ok := isLocal[r]; !ok || opt.NoShm {
			if r != job.Rank {
				remote = append(remote, r)
			}
		}
	}

	if len(local) > 1 && !opt.NoShm {
		g, err := shm.Open(ctx, shm.Config{
			Name:      segmentName(job),
			Rank:      job.LocalRank,
			Size:      job.LocalSize,
			SlotBytes: opt.ShmSlotBytes,
			Dir:       opt.ShmDir,
			Timeout:   opt.Timeout,
			Spin:      opt.ShmSpin,

			ProgressTimeout: opt.ProgressTimeout,
			Host:            job.Hostname,
			Ranks:           local,
		})
		if err != nil {
			return nil, fmt.Errorf("rank %d: open shared memory for host %s: %w", job.Rank, job.Hostname, err)
		}
		w.shm = g
		w.closers = append(w.closers, g.Close)
		for i, r := range local {
			links[r] = transport.Link{Comm: g.Comm(), Messenger: g.Messenger(), Peer: i}
		}
		w.Local = g.Comm()
	}

	cross := crossGroup(w.Hosts, job) // the hierarchical allreduce's peers: connected at once, and Cross
	if len(remote) > 0 {
		m, err := tcp.Connect(ctx, ln, tcp.Config{
			Rank: job.Rank, Size: job.Size, Peers: remote, Addrs: addrs, Hosts: w.Hosts,
			Secret: secret, JobID: job.JobID, Streams: opt.TCPStreams, ConnectTimeout: opt.Timeout,
			ProgressTimeout: opt.ProgressTimeout, Listening: true,
			Lazy: !opt.FullMesh, Eager: eagerPeers(job.Rank, job.Size, remote, cross),
		})
		if err != nil {
			return nil, fmt.Errorf("rank %d: connect to ranks on other hosts: %w", job.Rank, err)
		}
		w.mesh = m
		w.closers = append(w.closers, m.Close)
		for _, r := range remote {
			links[r] = transport.Link{Comm: m.Comm(), Messenger: m.Messenger(), Peer: r}
		}
	}

	route := transport.NewRoute(job.Rank, links)
	w.closers = append(w.closers, route.Close)
	w.Comm, w.Messenger = route, route
	if w.Local == nil {
		w.Local, err = transport.Sub(route, local)
		if err != nil {
			return nil, err
		}
	}
	if len(cross) > 1 {
		w.Cross, err = transport.Sub(route, cross)
		if err != nil {
			return nil, err
		}
	}
	ok = true
	return w, nil
}

// Abort makes every blocked shared-memory wait on this host fail, so that ranks waiting on a
// rank that is itself waiting on a lost peer do not hang.
func (w *World) Abort(err error) {
	if w.shm != nil {
		w.shm.Abort(err)
	}
}

// Close tears down every connection, last opened first.
func (w *World) Close() error {
	var errs []error
	for i := len(w.closers) - 1; i >= 0; i-- {
		if err := w.closers[i](); err != nil && !errors.Is(err, transport.ErrClosed) {
			errs = append(errs, err)
		}
	}
	w.closers = nil
	return errors.Join(errs...)
}

// RemoteConnected is the number of ranks of other hosts this rank has connections to: with a
// lazy mesh (the default), those its collectives have needed so far.
func (w *World) RemoteConnected() int {
	if w.mesh == nil {
		return 0
	}
	return w.mesh.ConnectedPeers()
}

// crossGroup returns, when every host runs the same number of ranks, the ranks that share this
// rank's local rank, one per host in host order; otherwise nil.
func crossGroup(hosts []string, job jobenv.Job) []int {
	order := []string{}
	byHost := map[string][]int{}
	for r, h := range hosts {
		if _, ok := byHost[h]; !ok {
			order = append(order, h)
		}
		byHost[h] = append(byHost[h], r)
	}
	n := len(byHost[order[0]])
	for _, h := range order {
		if len(byHost[h]) != n {
			return nil
		}
	}
	var cross []int
	for _, h := range order {
		cross = append(cross, byHost[h][job.LocalRank])
	}
	return cross
}

// eagerPeers are the remote ranks a rank connects to at start-up: those its first collectives
// use. The coordinator, rank 0, exchanges the negotiation with every rank; the hierarchical
// allreduce goes between the ranks of the same local rank on each host (cross); the ring
// algorithms over the whole job go to the next and previous rank. Each relation is symmetric, as
// tcp.Config.Eager requires. The rest (an alltoall's, recursive doubling's partners) connect on
// first use.
func eagerPeers(rank, size int, remote, cross []int) []int {
	want := map[int]bool{(rank + 1) % size: true, (rank + size - 1) % size: true, 0: true}
	for _, r := range cross {
		want[r] = true
	}
	var out []int
	for _, r := range remote {
		if want[r] || rank == 0 {
			out = append(out, r)
		}
	}
	return out
}

// listenAddr is the one address a rank listens on for its peers and publishes to them: the
// --network-interface address, else the address of this end of its connection to the rendezvous
// (the route its hosts use). Never every interface: a stranger on a network the job does not use
// cannot reach the port. A rendezvous at a Unix socket means a job on one host whose launcher made
// the socket's directory for the job alone: the rank's socket goes beside it, under a name no
// other world of the process takes (a subset's, a later Init's).
func listenAddr(job jobenv.Job, toRendezvous net.Addr, iface net.IP) (string, error) {
	if iface != nil {
		return net.JoinHostPort(iface.String(), "0"), nil
	}
	if endpoint.IsUnix(job.Rendezvous) {
		var b [4]byte // endpoint.Dir leaves room for the name
		rand.Read(b[:])
		return filepath.Join(filepath.Dir(job.Rendezvous), fmt.Sprintf("r%d-%x.sock", job.Rank, b)), nil
	}
	ta, ok := toRendezvous.(*net.TCPAddr)
	if !ok {
		return "", fmt.Errorf("unexpected address type %T of the connection to the rendezvous", toRendezvous)
	}
	return (&net.TCPAddr{IP: ta.IP, Zone: ta.Zone}).String(), nil
}

// recordsKey is the rendezvous Gather of the address records of the world of job id jobID; rank
// r's record lies at recordsKey/r. The job id is unique per world a process joins (kolo.Init
// makes it so for a later Init after Shutdown and for a subset of ranks), so that no rank reads
// a record another world left.
func recordsKey(jobID string) string { return "world/" + jobID + "/rank" }

// RecordKey is where rank r of the world of job id jobID publishes its address in the rendezvous
// ("addr|host|boot id|endpoint id"), for tests that play a stranger on the network.
func RecordKey(jobID string, r int) string { return recordsKey(jobID) + "/" + strconv.Itoa(r) }

var unsafeChars = regexp.MustCompile(`[^A-Za-z0-9_.-]`)

// segmentName is unique per job and host and safe as a file name.
func segmentName(job jobenv.Job) string {
	h := sha256.Sum256([]byte(job.JobID + "\x00" + job.Rendezvous))
	host := unsafeChars.ReplaceAllString(job.Hostname, "_")
	if len(host) > 40 {
		host = host[:40]
	}
	return "kolo-" + hex.EncodeToString(h[:6]) + "-" + host
}

func bootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		hn, _ := os.Hostname()
		return hn
	}
	return strings.TrimSpace(string(b))
}
