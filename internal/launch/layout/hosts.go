package layout

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
)

// ParseHosts parses horovodrun's -H syntax: "host1:2,host2:4,host3" (a host without :N has 1 slot).
// IPv6 literals go in brackets: "[fe80::1]:2".
func ParseHosts(spec string) ([]Host, error) {
	var hosts []Host
	for _, item := range strings.Split(spec, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		h, err := parseHostSlots(item)
		if err != nil {
			return nil, fmt.Errorf("-H %q: %w", spec, err)
		}
		hosts = append(hosts, h)
	}
	if len(hosts) == 0 {
		return nil, fmt.Errorf("-H %q names no hosts", spec)
	}
	return mergeDuplicates(hosts), nil
}

func parseHostSlots(item string) (Host, error) {
	name, slots := item, "1"
	if strings.HasPrefix(item, "[") {
		end := strings.Index(item, "]")
		if end < 0 {
			return Host{}, fmt.Errorf("unclosed '[' in %q", item)
		}
		name = item[1:end]
		rest := item[end+1:]
		if rest != "" {
			if !strings.HasPrefix(rest, ":") {
				return Host{}, fmt.Errorf("unexpected %q after ']' in %q", rest, item)
			}
			slots = rest[1:]
		}
	} else if i := strings.LastIndex(item, ":"); i >= 0 {
		name, slots = item[:i], item[i+1:]
	}
	n, err := strconv.Atoi(slots)
	if err != nil || n <= 0 {
		return Host{}, fmt.Errorf("slots in %q must be a positive integer", item)
	}
	if err := CheckHostName(name); err != nil {
		return Host{}, fmt.Errorf("%q: %w", item, err)
	}
	return Host{Name: name, Slots: n}, nil
}

// CheckHostName accepts a host name (letters, digits, '.', '-', '_'; not starting with '-', which
// ssh would read as an option) or an IP address; anything else (spaces, a second ':', a user@) is
// an error saying what is wrong.
func CheckHostName(name string) error {
	switch _, ipErr := netip.ParseAddr(name); {
	case name == "":
		return errors.New("empty host name")
	case ipErr == nil:
		return nil
	case name[0] == '-':
		return fmt.Errorf("host name %q starts with '-'", name)
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '-' || r == '_') {
			return fmt.Errorf("host name %q has %q: want a host name or an IP address, with one optional :SLOTS", name, r)
		}
	}
	return nil
}

// ParseHostfile reads the hostfile format of horovodrun/OpenMPI: one host per line, optionally
// "slots=N" (default 1), '#' starts a comment, blank lines ignored. Errors name file and line.
func ParseHostfile(name string, r io.Reader) ([]Host, error) {
	var hosts []Host
	sc := bufio.NewScanner(r)
	line := 0
	for sc.Scan() {
		line++
		text := sc.Text()
		if i := strings.IndexByte(text, '#'); i >= 0 {
			text = text[:i]
		}
		fields := strings.Fields(text)
		if len(fields) == 0 {
			continue
		}
		h := Host{Name: fields[0], Slots: 1}
		if strings.Contains(h.Name, "=") {
			return nil, fmt.Errorf("%s:%d: expected a host name first, got %q", name, line, fields[0])
		}
		if err := CheckHostName(h.Name); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", name, line, err)
		}
		for _, f := range fields[1:] {
			k, v, ok := strings.Cut(f, "=")
			switch {
			case !ok:
				return nil, fmt.Errorf("%s:%d: unexpected %q (want slots=N)", name, line, f)
			case k == "slots" || k == "max_slots" || k == "max-slots":
				n, err := strconv.Atoi(v)
				if err != nil || n <= 0 {
					return nil, fmt.Errorf("%s:%d: %s must be a positive integer, got %q", name, line, k, v)
				}
				if k == "slots" {
					h.Slots = n
				}
			default:
				return nil, fmt.Errorf("%s:%d: unknown attribute %q (want slots=N)", name, line, k)
			}
		}
		hosts = append(hosts, h)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: read: %w", name, err)
	}
	if len(hosts) == 0 {
		return nil, fmt.Errorf("%s: no hosts listed", name)
	}
	return mergeDuplicates(hosts), nil
}

// ReadHostfile opens and parses a hostfile.
func ReadHostfile(path string) ([]Host, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("hostfile: %w", err)
	}
	defer f.Close()
	return ParseHostfile(path, f)
}

// mergeDuplicates adds the slots of a host listed twice, keeping first-seen order, as OpenMPI does.
func mergeDuplicates(hosts []Host) []Host {
	idx := map[string]int{}
	var out []Host
	for _, h := range hosts {
		if i, ok := idx[h.Name]; ok {
			out[i].Slots += h.Slots
			continue
		}
		idx[h.Name] = len(out)
		out = append(out, h)
	}
	return out
}

// IsLocal reports whether a host name designates the launching machine.
func IsLocal(name string) bool {
	hn, err := os.Hostname()
	return slices.Contains([]string{"localhost", "127.0.0.1", "::1", "localhost.localdomain"}, name) || err == nil && hn == name
}
