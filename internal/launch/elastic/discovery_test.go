package elastic

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestParseDiscovery(t *testing.T) {
	tests := []struct {
		name  string
		out   string
		slots int // --slots-per-host
		want  []Host
		err   string // substring of the error; "" for none
	}{
		{name: "slots given", out: "host-1:4\nhost-2:4\nhost-3:4\n", want: []Host{{"host-1", 4}, {"host-2", 4}, {"host-3", 4}}},
		{name: "default slots", out: "a\nb:2", slots: 3, want: []Host{{"a", 3}, {"b", 2}}},
		{name: "discovery order kept", out: "z:1\na:1\nm:1", want: []Host{{"z", 1}, {"a", 1}, {"m", 1}}},
		{name: "localhost and 127.0.0.1 are two hosts", out: "localhost:2\n127.0.0.1:2", want: []Host{{"localhost", 2}, {"127.0.0.1", 2}}},
		{name: "blank lines, CRLF and padding", out: "\r\n  a:1  \r\n\n\tb:2\r\n", want: []Host{{"a", 1}, {"b", 2}}},
		{name: "empty output is no hosts", out: "", want: nil},
		{name: "only blank lines", out: "\n \n", want: nil},
		{name: "IPv6 in brackets", out: "[fe80::1]:2\n[::1]", slots: 1, want: []Host{{"fe80::1", 2}, {"::1", 1}}},
		{name: "underscore", out: "node_7:1", want: []Host{{"node_7", 1}}},

		{name: "no slots, no default", out: "a:1\nb", err: `line 2: "b": no slot count, and no --slots-per-host`},
		{name: "slots not a number", out: "a:x", err: `line 1: "a:x": slots must be a positive integer, got "x"`},
		{name: "zero slots", out: "a:0", err: `slots must be a positive integer, got "0"`},
		{name: "negative slots", out: "a:-2", err: `got "-2"`},
		{name: "empty slots", out: "a:", err: `got ""`},
		{name: "slots overflow", out: "a:99999999999999999999999", err: "slots must be a positive integer"},
		{name: "empty host", out: ":2", err: `line 1: ":2": empty host name`},
		{name: "duplicate host", out: "a:1\nb:1\na:2", err: `line 3: host "a" already listed on line 1`},
		{name: "traceback", out: "Traceback (most recent call last):", err: "line 1: \"Traceback (most recent call last):\": want host or host:slots, with no spaces"},
		{name: "hostfile syntax", out: "a slots=4", err: "with no spaces"},
		{name: "comma list", out: "a:2,b:2", err: `line 1: "a:2,b:2": one host per line, not a comma-separated list`},
		{name: "bare IPv6", out: "fe80::1:2", err: "IPv6 addresses go in brackets"},
		{name: "unclosed bracket", out: "[fe80::1:2", err: "unclosed '['"},
		{name: "junk after bracket", out: "[::1]x", err: `unexpected "x" after ']'`},
		{name: "IPv4 in brackets", out: "[10.0.0.1]:2", err: "is not an IPv6 address"},
		{name: "leading dash is an ssh option", out: "-oProxyCommand=x:1", err: `host name may not start with '-'`},
		{name: "shell characters", out: "a;reboot:1", err: `';' is not allowed in a host name`},
		{name: "error on a later line", out: "a:1\nb:1\n\nERROR\n", err: `line 4: "ERROR": no slot count`},
		{name: "long garbage is clipped", out: strings.Repeat("x", 100) + ":y", err: strings.Repeat("x", 60) + `..."`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseDiscovery(tc.out, tc.slots)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %v, %v; want an error containing %q", got, err, tc.err)
				}
				if !errors.Is(err, ErrDiscoveryOutput) {
					t.Errorf("%v does not wrap ErrDiscoveryOutput", err)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("got %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

func TestCompare(t *testing.T) {
	tests := []struct {
		name       string
		prev, next []Host
		want       string
	}{
		{"nothing", []Host{{"a", 2}}, []Host{{"a", 2}}, "no change"},
		{"first discovery", nil, []Host{{"a", 2}, {"b", 1}}, "+a:2 +b:1"},
		{"added and removed", []Host{{"a", 2}, {"b", 2}}, []Host{{"b", 2}, {"c", 4}}, "+c:4 -a:2"},
		{"slots changed", []Host{{"a", 2}, {"b", 2}}, []Host{{"a", 4}, {"b", 1}}, "a:2->4 b:2->1"},
		{"reordered only", []Host{{"a", 1}, {"b", 1}}, []Host{{"b", 1}, {"a", 1}}, "no change"},
		{"names not resolved", []Host{{"localhost", 2}}, []Host{{"127.0.0.1", 2}}, "+127.0.0.1:2 -localhost:2"},
		{"everything gone", []Host{{"a", 1}, {"::1", 2}}, nil, "-a:1 -[::1]:2"},
		{"IPv6 resize", []Host{{"::1", 1}}, []Host{{"::1", 3}}, "[::1]:1->3"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := Compare(tc.prev, tc.next)
			if got := d.String(); got != tc.want {
				t.Errorf("Compare = %q, want %q", got, tc.want)
			}
			if d.Empty() != (tc.want == "no change") {
				t.Errorf("Empty() = %v for %q", d.Empty(), tc.want)
			}
		})
	}
}

// FuzzParseDiscovery feeds arbitrary script output: ParseDiscovery must not panic, and what it
// accepts must print back (one Host.String per line) to the same listing.
func FuzzParseDiscovery(f *testing.F) {
	for _, s := range []string{"a:1\nb:2\n", "localhost\n127.0.0.1:4", "[::1]:2", "x y", "a:\n", ":", "[", "a:1\na:1"} {
		f.Add(s, 2)
	}
	f.Fuzz(func(t *testing.T, out string, slots int) {
		hosts, err := ParseDiscovery(out, slots)
		if err != nil {
			return
		}
		var lines []string
		for _, h := range hosts {
			if h.Slots <= 0 {
				t.Fatalf("%q: host %v with no slots", out, h)
			}
			lines = append(lines, h.String())
		}
		again, err := ParseDiscovery(strings.Join(lines, "\n"), 0)
		if err != nil || !slices.Equal(again, hosts) {
			t.Fatalf("%q parsed to %v, which prints back as %q and parses to %v, %v", out, hosts, lines, again, err)
		}
	})
}
