package launch

import (
	"cmp"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/kolo-dl/kolo/internal/endpoint"
	"github.com/kolo-dl/kolo/internal/launch/elastic"
	"github.com/kolo-dl/kolo/internal/launch/layout"
	"github.com/kolo-dl/kolo/internal/netif"
	"github.com/kolo-dl/kolo/internal/rendezvous"
)

// listenOneHost makes the rendezvous of a job all on this machine listen on a Unix socket in a new
// directory only this user may enter (endpoint.Dir, where the ranks put their sockets too): another
// user's process cannot even connect, where on loopback each costs an accept and a handshake. It
// returns the socket and the directory, which the caller removes; claim is told the directory first.
func listenOneHost(srv *rendezvous.Server, claim func(dir string)) (sock, dir string, err error) {
	dir, err = endpoint.Dir(claim)
	if err != nil {
		return "", "", err
	}
	sock = filepath.Join(dir, "rendezvous.sock")
	if _, err := srv.Listen(sock); err != nil {
		os.RemoveAll(dir)
		return "", "", err
	}
	slog.Debug("rendezvous listening", "addr", sock)
	return sock, dir, nil
}

// rendezvousListeners makes the launcher's rendezvous listen where its workers are told to dial
// it, and nowhere else: loopback for a job on this machine, the --network-interface address, or
// the address this machine reaches each other host from; every interface only for a worker given
// this machine's name (no address routes to its host), as the name may resolve to any of them. One
// port serves every address, so that a worker's rendezvous address is its host's IP and that port.
type rendezvousListeners struct {
	srv *rendezvous.Server

	mu   sync.Mutex
	port string          // "" until the first listener is up
	on   map[string]bool // hosts listened on ("" for every interface)
}

// newRendezvousListeners returns srv's listeners, none yet, sharing port ("": the first one's).
func newRendezvousListeners(srv *rendezvous.Server, port string) *rendezvousListeners {
	return &rendezvousListeners{srv: srv, port: port, on: map[string]bool{}}
}

// at makes the rendezvous listen on host unless it does already, and returns HOST:PORT for
// workers to dial. host is an IP; a name (or "") listens on every interface when nothing listens
// yet, else nowhere new: it is taken to resolve to an address listened on already (a no-ssh
// node's --rendezvous HOST resolves to the address it serves at), since every interface could
// not be bound beside them.
func (l *rendezvousListeners) at(host string) (string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	bind := host
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		bind = ""
	}
	if !l.on[bind] && !l.on[""] && (bind != "" || len(l.on) == 0) {
		addr, err := l.srv.Listen(net.JoinHostPort(bind, cmp.Or(l.port, "0")))
		if err != nil {
			return "", fmt.Errorf("rendezvous: %w", err)
		}
		_, l.port, _ = net.SplitHostPort(addr.String())
		l.on[bind] = true
		slog.Debug("rendezvous listening", "addr", addr.String())
	}
	return net.JoinHostPort(host, l.port), nil
}

// atAll is at for each of hosts, and returns each one's HOST:PORT. A name, which listens on every
// interface, goes first: it could not bind beside a listener on one of them.
func (l *rendezvousListeners) atAll(hosts []string) (map[string]string, error) {
	hosts = slices.Clone(hosts)
	slices.SortFunc(hosts, func(a, b string) int {
		if ipA, ipB := net.ParseIP(a) != nil, net.ParseIP(b) != nil; ipA != ipB {
			if ipA {
				return 1
			}
			return -1
		}
		return strings.Compare(a, b)
	})
	addrs := map[string]string{}
	for _, h := range slices.Compact(hosts) {
		a, err := l.at(h)
		if err != nil {
			return nil, err
		}
		addrs[h] = a
	}
	return addrs, nil
}

// rendezvousAddrs says which of the launcher's addresses each host's workers dial: the same for
// every host (--network-interface's address, or loopback when every host is this machine), else
// per other host the address this machine reaches it from (one it can route to, not a name only
// this machine resolves), and for this machine's workers the first other host's. An elastic
// job's hosts come and go, so it decides per host, when a worker starts there.
type rendezvousAddrs struct {
	lns    *rendezvousListeners
	fixed  string            // every host's: --network-interface's address, or loopback when every host is this machine
	remote map[string]string // per other host: the address this machine reaches it from

	loopback bool // workers of this machine were given loopback, no other host being listed
	warned   bool
}

func newRendezvousAddrs(iface string, discovery bool, fixed []elastic.Host) (*rendezvousAddrs, error) {
	a := &rendezvousAddrs{remote: map[string]string{}}
	if iface != "" {
		ip, _, err := netif.InterfaceIP(iface)
		if err != nil {
			return nil, fmt.Errorf("--network-interface: %w", err)
		}
		a.fixed = ip.String()
		return a, nil
	}
	allLocal := !discovery
	for _, h := range fixed {
		allLocal = allLocal && layout.IsLocal(h.Name)
	}
	if allLocal {
		a.fixed = "127.0.0.1"
	}
	return a, nil
}

// dial is the HOST:PORT the workers of host dial (hosts: the current discovery), where the
// rendezvous now listens (lns); should it fail to listen there, the workers' dial fails and says
// so.
func (a *rendezvousAddrs) dial(host string, hosts []elastic.Host) string {
	ip := a.ip(host, hosts)
	addr, err := a.lns.at(ip)
	if err != nil {
		slog.Warn("the rendezvous cannot listen where the workers of a host dial it", "host", host, "addr", ip, "err", err)
		return net.JoinHostPort(ip, "0")
	}
	return addr
}

// ip is the address the workers of host dial the rendezvous at (hosts: every host now). A worker
// tells its peers the address it reaches the rendezvous from: a worker of this machine gets the
// address other hosts reach it at, when there are other hosts.
func (a *rendezvousAddrs) ip(host string, hosts []elastic.Host) string {
	ip := a.fixed
	if ip == "" && !layout.IsLocal(host) {
		ip = a.remoteAddr(host)
	}
	for _, h := range hosts {
		if ip == "" && !layout.IsLocal(h.Name) {
			ip = a.remoteAddr(h.Name)
		}
	}
	if ip == "" {
		a.loopback, ip = true, "127.0.0.1"
	}
	return ip
}

func (a *rendezvousAddrs) remoteAddr(host string) string {
	if v, ok := a.remote[host]; ok {
		return v
	}
	if a.loopback && !a.warned {
		a.warned = true
		slog.Warn("workers of this machine were started on loopback, when no other host was listed; the workers of other hosts may not reach them: give --network-interface", "host", host)
	}
	ip, err := netif.SourceIP(host)
	if err == nil {
		a.remote[host] = ip.String()
		return a.remote[host]
	}
	// ssh may know the host by a name only its config resolves: give the workers our name.
	hn, herr := os.Hostname()
	if herr != nil {
		hn = "127.0.0.1" // the worker's dial fails and says so
	}
	slog.Warn("cannot tell which address of this machine host reaches; giving its workers this machine's name (use --network-interface to choose)", "host", host, "err", err, "name", hn)
	a.remote[host] = hn
	return hn
}
