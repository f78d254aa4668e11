// Package netif answers the address questions a launcher and a worker ask about the machine they run
// on: which IP a named network interface has (--network-interface), which local IP the kernel would
// use to reach a given host (so a launcher can tell remote workers where to find it), and whether a
// host name designates this machine.
//
// It reads interface tables and routing decisions only; it must not send traffic (the route lookup
// "connects" a UDP socket, which sends nothing).
package netif

import (
	"context"
	"fmt"
	"net"
	"strings"
	"time"
)

// InterfaceIP returns the first IPv4 address of the first interface in list (comma-separated
// names, horovodrun's --network-interface syntax) that exists here and has one, and that interface's
// name. An IPv6-only interface is used when no listed interface has an IPv4 address.
func InterfaceIP(list string) (net.IP, string, error) {
	var names []string
	for _, n := range strings.Split(list, ",") {
		if n = strings.TrimSpace(n); n != "" {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return nil, "", fmt.Errorf("network interface: empty list %q", list)
	}
	var v6 net.IP
	var v6name string
	for _, n := range names {
		ifc, err := net.InterfaceByName(n)
		if err != nil {
			continue
		}
		addrs, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			ipn, ok := a.(*net.IPNet)
			if !ok {
				continue
			}
			if ip4 := ipn.IP.To4(); ip4 != nil {
				return ip4, n, nil
			}
			if v6 == nil && !ipn.IP.IsLinkLocalUnicast() {
				v6, v6name = ipn.IP, n
			}
		}
	}
	if v6 != nil {
		return v6, v6name, nil
	}
	return nil, "", fmt.Errorf("network interface %q: none exists here with an address (this host has: %s)", list, strings.Join(interfaceNames(), ", "))
}

func interfaceNames() []string {
	ifs, err := net.Interfaces()
	if err != nil {
		return []string{"<cannot list interfaces: " + err.Error() + ">"}
	}
	names := make([]string, len(ifs))
	for i, ifc := range ifs {
		names[i] = ifc.Name
	}
	return names
}

// SourceIP returns the local address the kernel picks to reach host (a name or an IP; a
// "user@" prefix is ignored): the address that host can most likely reach this machine at.
func SourceIP(host string) (net.IP, error) {
	host = StripUser(host)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ips, err := net.DefaultResolver.LookupIPAddr(ctx, host)
	if err != nil {
		return nil, fmt.Errorf("resolve %s: %w", host, err)
	}
	var lastErr error
	for _, ip := range ips {
		// A UDP "connect" only asks the routing table; no packet leaves.
		c, err := net.DialUDP("udp", nil, &net.UDPAddr{IP: ip.IP, Port: 9, Zone: ip.Zone})
		if err != nil {
			lastErr = err
			continue
		}
		local := c.LocalAddr().(*net.UDPAddr).IP
		c.Close()
		return local, nil
	}
	if lastErr == nil {
		lastErr = fmt.Errorf("no addresses")
	}
	return nil, fmt.Errorf("route to %s: %w", host, lastErr)
}

// IsThisMachine reports whether host resolves to a loopback address or to an address assigned to
// one of this machine's interfaces.
func IsThisMachine(host string) bool {
	host = StripUser(host)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ips, err := net.DefaultResolver.LookupIPAddr(ctx, host)
	if err != nil {
		return false
	}
	local := map[string]bool{}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok {
				local[ipn.IP.String()] = true
			}
		}
	}
	for _, ip := range ips {
		if ip.IP.IsLoopback() || local[ip.IP.String()] {
			return true
		}
	}
	return false
}

// StripUser removes ssh's "user@" prefix from a host.
func StripUser(host string) string {
	if i := strings.LastIndexByte(host, '@'); i >= 0 {
		return host[i+1:]
	}
	return host
}

// AddressHere returns the first address host resolves to (host may be an IP) that is assigned to
// an interface of this machine and is not loopback: where a server named host here should listen
// for other machines, and no wider.
func AddressHere(host string) (net.IP, bool) {
	host = StripUser(host)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ips, err := net.DefaultResolver.LookupIPAddr(ctx, host)
	if err != nil {
		return nil, false
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, false
	}
	for _, ip := range ips {
		if ip.IP.IsLoopback() {
			continue
		}
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.Equal(ip.IP) {
				return ip.IP, true
			}
		}
	}
	return nil, false
}
