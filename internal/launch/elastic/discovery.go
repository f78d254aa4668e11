package elastic

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Host is one machine a discovery listed, and how many workers it may run. Hosts are compared by
// name only, never resolved: "localhost" and "127.0.0.1" are two hosts of one job, as in
// Horovod's own elastic tests.
type Host struct {
	Name  string
	Slots int
}

func (h Host) String() string { return fmt.Sprintf("%s:%d", bracketed(h.Name), h.Slots) }

// bracketed writes an IPv6 literal the way ParseDiscovery reads it back.
func bracketed(name string) string {
	if strings.Contains(name, ":") {
		return "[" + name + "]"
	}
	return name
}

// ErrDiscoveryOutput marks output of a discovery script that is not a host list. Such output is
// a failed discovery, never an empty one: a script that prints a Python traceback must not read
// as "every host left".
var ErrDiscoveryOutput = errors.New("discovery output")

// ParseDiscovery parses what a --host-discovery-script printed: one "host" or "host:slots" per
// line, IPv6 literals in brackets ("[fe80::1]:2"). A line without slots gets defaultSlots
// (--slots-per-host); it is an error when that is 0. Blank lines are skipped and empty output is
// no hosts (Horovod documents that for "no worker ready yet"). Anything else is an error naming
// the line: a listing must be trusted whole or not at all, since a host missing from it is taken
// as removed and its ranks are stopped.
func ParseDiscovery(out string, defaultSlots int) ([]Host, error) {
	var hosts []Host
	seen := map[string]int{} // host name -> line
	for i, raw := range strings.Split(out, "\n") {
		line := i + 1
		text := strings.TrimSpace(raw)
		if text == "" {
			continue
		}
		h, err := parseDiscoveryLine(text, defaultSlots)
		if err != nil {
			return nil, fmt.Errorf("%w line %d: %q: %s", ErrDiscoveryOutput, line, clip(text), err)
		}
		if first, dup := seen[h.Name]; dup {
			return nil, fmt.Errorf("%w line %d: host %q already listed on line %d", ErrDiscoveryOutput, line, h.Name, first)
		}
		seen[h.Name] = line
		hosts = append(hosts, h)
	}
	return hosts, nil
}

// parseDiscoveryLine returns an error without position; the caller adds it.
func parseDiscoveryLine(text string, defaultSlots int) (Host, error) {
	if strings.ContainsAny(text, " \t") {
		return Host{}, errors.New("want host or host:slots, with no spaces")
	}
	if strings.Contains(text, ",") {
		return Host{}, errors.New("one host per line, not a comma-separated list")
	}
	name, slots, hasSlots := text, "", false
	if strings.HasPrefix(text, "[") {
		end := strings.IndexByte(text, ']')
		if end < 0 {
			return Host{}, errors.New("unclosed '['")
		}
		name = text[1:end]
		if rest := text[end+1:]; rest != "" {
			if !strings.HasPrefix(rest, ":") {
				return Host{}, fmt.Errorf("unexpected %q after ']'", rest)
			}
			slots, hasSlots = rest[1:], true
		}
		if err := checkIPv6(name); err != nil {
			return Host{}, err
		}
	} else {
		if strings.Count(text, ":") > 1 {
			return Host{}, errors.New("more than one ':' (IPv6 addresses go in brackets: [fe80::1]:2)")
		}
		name, slots, hasSlots = strings.Cut(text, ":")
		if err := checkHostName(name); err != nil {
			return Host{}, err
		}
	}
	if !hasSlots {
		if defaultSlots <= 0 {
			return Host{}, errors.New("no slot count, and no --slots-per-host to default to")
		}
		return Host{Name: name, Slots: defaultSlots}, nil
	}
	n, err := strconv.Atoi(slots)
	if err != nil || n <= 0 {
		return Host{}, fmt.Errorf("slots must be a positive integer, got %q", slots)
	}
	return Host{Name: name, Slots: n}, nil
}

// checkHostName accepts what DNS names and IPv4 addresses are made of. The name ends up as an
// ssh argument, so a leading '-' (an ssh option) is refused along with anything a shell or a
// traceback would contain.
func checkHostName(name string) error {
	if name == "" {
		return errors.New("empty host name")
	}
	if name[0] == '-' || name[0] == '.' {
		return fmt.Errorf("host name may not start with %q", name[0])
	}
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_') {
			return fmt.Errorf("%q is not allowed in a host name", c)
		}
	}
	return nil
}

func checkIPv6(addr string) error {
	if !strings.Contains(addr, ":") {
		return fmt.Errorf("%q in brackets is not an IPv6 address", addr)
	}
	for _, c := range addr {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' || c == ':' || c == '.') {
			return fmt.Errorf("%q is not allowed in an IPv6 address", c)
		}
	}
	return nil
}

// clip keeps error messages readable when a script dumps a long line.
func clip(s string) string {
	const limit = 60
	if len(s) <= limit {
		return s
	}
	return s[:limit] + "..."
}

// checkHosts validates a listing that did not come through ParseDiscovery.
func checkHosts(hosts []Host) error {
	seen := map[string]bool{}
	for _, h := range hosts {
		if h.Name == "" {
			return errors.New("a host has an empty name")
		}
		if h.Slots <= 0 {
			return fmt.Errorf("host %q has %d slots; a listed host needs at least 1", h.Name, h.Slots)
		}
		if seen[h.Name] {
			return fmt.Errorf("host %q listed twice", h.Name)
		}
		seen[h.Name] = true
	}
	return nil
}

// Diff is what changed between two successive discoveries.
type Diff struct {
	Added   []Host   // in the new listing's order
	Removed []Host   // with the slots they had, in the old listing's order
	Resized []Resize // listed both times with another slot count, in the new listing's order
}

// Resize is a host whose slot count changed between two discoveries.
type Resize struct {
	Name     string
	From, To int
}

// Compare returns what changed from the discovery prev to the discovery next.
func Compare(prev, next []Host) Diff {
	var d Diff
	old := make(map[string]int, len(prev))
	for _, h := range prev {
		old[h.Name] = h.Slots
	}
	now := make(map[string]bool, len(next))
	for _, h := range next {
		now[h.Name] = true
		from, ok := old[h.Name]
		switch {
		case !ok:
			d.Added = append(d.Added, h)
		case from != h.Slots:
			d.Resized = append(d.Resized, Resize{Name: h.Name, From: from, To: h.Slots})
		}
	}
	for _, h := range prev {
		if !now[h.Name] {
			d.Removed = append(d.Removed, h)
		}
	}
	return d
}

// Empty reports whether nothing changed.
func (d Diff) Empty() bool {
	return len(d.Added) == 0 && len(d.Removed) == 0 && len(d.Resized) == 0
}

// String lists the changes for a log line: "+c:2 -a:4 b:2->4".
func (d Diff) String() string {
	if d.Empty() {
		return "no change"
	}
	var parts []string
	for _, h := range d.Added {
		parts = append(parts, "+"+h.String())
	}
	for _, h := range d.Removed {
		parts = append(parts, "-"+h.String())
	}
	for _, r := range d.Resized {
		parts = append(parts, fmt.Sprintf("%s:%d->%d", bracketed(r.Name), r.From, r.To))
	}
	return strings.Join(parts, " ")
}
