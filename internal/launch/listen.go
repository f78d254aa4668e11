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
