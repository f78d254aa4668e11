// Package settings declares every environment variable kolo reads, each once (registry.go): its
// name, Horovod's spelling where Horovod has one, which parser reads it, its default, the values
// it accepts and one line of help. Readers ask a declaration for its value (Lookup and the typed
// readers below), so that a variable is found by grepping its name and every reader of it parses
// it alike; kolo run's pre-start check (Check) and the README's settings table (Table, written
// by go run ./internal/settings/gen) come from the same declarations.
//
// It imports no kolo package, so that every package can read its settings here, and it must not
// act on a setting: what a value does is its reader's business.
package settings

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Kind is how a setting's value is written, and so which parser reads it.
type Kind uint8

const (
	Text     Kind = iota // free text: a path, a name, an address
	Switch               // on/off: 1, true, on, yes or 0, false, off, no (any case); empty is off
	Bool                 // strconv.ParseBool's words (the engine's switches, as Horovod's)
	Count                // a non-negative integer
	Fraction             // a number in [0, 1]
	Bytes                // a byte count: 67108864, 64MiB, 1.5G (K, M, G are powers of 2)
	Duration             // a bare non-negative number in the setting's Unit, or a Go duration ("5ms")
	Seconds              // a positive number of seconds
	Choice               // one of Choices, any case
)

// Who says who sets a variable, and so whether the README documents it.
type Who uint8

const (
	User     Who = iota // the user, for the ranks or for kolo run: documented, checked before start
	Launcher            // kolo run (or mpirun, srun) for its ranks: the contract of docs/design.md
	Harness             // kolo's own tests and benchmark scripts
)

// Setting is the one declaration of a variable.
type Setting struct {
	Name string
	// Horovod lists Horovod's spellings, read in order when Name is unset (KOLO_* wins).
	Horovod []string
	Kind    Kind
	Unit    time.Duration // Duration: the unit of a bare number
	Choices []string      // Choice: the accepted values of Name
	// HorovodChoices are the accepted values of the Horovod spellings when they differ from
	// Choices (Horovod's HOROVOD_GPU_OPERATIONS names a library where KOLO_NCCL says 0 or 1).
	HorovodChoices []string
	Default        string // as the README shows it; "" when unset means off or nothing
	Flag           string // kolo run's flag that sets it, if any
	Help           string // one line: what it does
	Who            Who
}

// Lookup returns the variable that is set, Name before the Horovod spellings, and its value with
// the spaces around it removed; key is "" when none is set (or only to spaces).
func (s *Setting) Lookup(getenv func(string) string) (key, value string) {
	for _, k := range s.names() {
		if v := strings.TrimSpace(getenv(k)); v != "" {
			return k, v
		}
	}
	return "", ""
}

func (s *Setting) names() []string { return append([]string{s.Name}, s.Horovod...) }

// Env adapts a map of variables (jobenv.FromEnviron's) to Lookup's getenv.
func Env(env map[string]string) func(string) string {
	return func(k string) string { return env[k] }
}

// ErrUnset is what the typed readers return when none of a setting's names is set: the reader's
// default applies.
var ErrUnset = errors.New("not set")

// errorf names the variable and its value, as every reader's message does.
func errorf(key, value, format string, args ...any) error {
	return fmt.Errorf("%s=%q: %s", key, value, fmt.Sprintf(format, args...))
}

// Bytes reads a Bytes setting.
func (s *Setting) Bytes(getenv func(string) string) (int64, error) {
	k, v := s.Lookup(getenv)
	if k == "" {
		return 0, ErrUnset
	}
	n, err := ParseBytes(v)
	if err != nil {
		return 0, errorf(k, v, "%v", err)
	}
	return n, nil
}

// Count reads a Count setting.
func (s *Setting) Count(getenv func(string) string) (int, error) {
	k, v := s.Lookup(getenv)
	if k == "" {
		return 0, ErrUnset
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0, errorf(k, v, "want a non-negative integer")
	}
	return n, nil
}

// Duration reads a Duration setting: a bare number counts in s.Unit (Horovod's convention),
// else a Go duration.
func (s *Setting) Duration(getenv func(string) string) (time.Duration, error) {
	k, v := s.Lookup(getenv)
	if k == "" {
		return 0, ErrUnset
	}
	if f, err := strconv.ParseFloat(v, 64); err == nil && f >= 0 {
		return time.Duration(f * float64(s.Unit)), nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return 0, errorf(k, v, "want a duration")
	}
	return d, nil
}

// Seconds reads a Seconds setting.
func (s *Setting) Seconds(getenv func(string) string) (time.Duration, error) {
	k, v := s.Lookup(getenv)
	if k == "" {
		return 0, ErrUnset
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f <= 0 {
		return 0, errorf(k, v, "want a positive number of seconds")
	}
	return time.Duration(f * float64(time.Second)), nil
}

// Bool reads a Bool setting.
func (s *Setting) Bool(getenv func(string) string) (bool, error) {
	k, v := s.Lookup(getenv)
	if k == "" {
		return false, ErrUnset
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, errorf(k, v, "want true/false/1/0")
	}
	return b, nil
}

// Switch reads a Switch setting; unset is ErrUnset, which callers take as their default.
func (s *Setting) Switch(getenv func(string) string) (bool, error) {
	k, v := s.Lookup(getenv)
	if k == "" {
		return false, ErrUnset
	}
	return ParseSwitch(k, v)
}

// ParseSwitch reads an on/off value of variable name: 1, true, on, yes or 0, false, off, no (any
// case); empty is off. Anything else is an error naming the variable.
func ParseSwitch(name, v string) (bool, error) {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "", "0", "false", "off", "no":
		return false, nil
	case "1", "true", "on", "yes":
		return true, nil
	}
	return false, fmt.Errorf("%s=%q: want 1 or 0 (true/false, on/off, yes/no)", name, v)
}

// Fraction reads a Fraction setting.
func (s *Setting) Fraction(getenv func(string) string) (float64, error) {
	k, v := s.Lookup(getenv)
	if k == "" {
		return 0, ErrUnset
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f < 0 || f > 1 {
		return 0, errorf(k, v, "want a number in [0, 1]")
	}
	return f, nil
}

// Choice reads a Choice setting: the variable that is set and its value as declared (the
// declaration's spelling, whatever case the user wrote).
func (s *Setting) Choice(getenv func(string) string) (key, value string, err error) {
	k, v := s.Lookup(getenv)
	if k == "" {
		return "", "", ErrUnset
	}
	choices := s.Choices
	if k != s.Name && s.HorovodChoices != nil {
		choices = s.HorovodChoices
	}
	for _, c := range choices {
		if strings.EqualFold(c, v) {
			return k, c, nil
		}
	}
	return k, v, errorf(k, v, "want one of %s", strings.Join(choices, ", "))
}

// ParseBytes reads a byte count: plain bytes and KiB/MiB/GiB (also K/M/G, KB/MB/GB as powers of
// 2), at most 1 TiB (no buffer kolo makes is larger).
func ParseBytes(s string) (int64, error) {
	s = strings.TrimSpace(s)
	mult := int64(1)
	upper := strings.ToUpper(s)
	for _, u := range []struct {
		suffix string
		m      int64
	}{{"KIB", 1 << 10}, {"MIB", 1 << 20}, {"GIB", 1 << 30}, {"KB", 1 << 10}, {"MB", 1 << 20}, {"GB", 1 << 30}, {"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"B", 1}} {
		if strings.HasSuffix(upper, u.suffix) {
			mult = u.m
			s = strings.TrimSpace(s[:len(s)-len(u.suffix)])
			break
		}
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f < 0 {
		return 0, fmt.Errorf("want a byte count like 67108864 or 64MiB")
	}
	if b := f * float64(mult); b > maxBytes {
		return 0, fmt.Errorf("%.4g bytes is more than kolo handles (%d, 1 TiB)", b, int64(maxBytes))
	}
	return int64(f * float64(mult)), nil
}

// maxBytes bounds a byte count a setting gives: no buffer kolo makes is larger.
const maxBytes = 1 << 40

// Check parses every User setting that getenv has, as its readers will, and returns one error per
// malformed value, each naming its variable: kolo run's check before it starts any rank.
func Check(getenv func(string) string) []error {
	var errs []error
	for _, s := range All {
		if s.Who != User {
			continue
		}
		var err error
		switch s.Kind {
		case Switch:
			_, err = s.Switch(getenv)
		case Bool:
			_, err = s.Bool(getenv)
		case Count:
			_, err = s.Count(getenv)
		case Fraction:
			_, err = s.Fraction(getenv)
		case Bytes:
			_, err = s.Bytes(getenv)
		case Duration:
			_, err = s.Duration(getenv)
		case Seconds:
			_, err = s.Seconds(getenv)
		case Choice:
			_, _, err = s.Choice(getenv)
		}
		if err != nil && !errors.Is(err, ErrUnset) {
			errs = append(errs, err)
		}
	}
	return errs
}

// Find finds the declaration of a variable by any of its names.
func Find(name string) (*Setting, bool) {
	for _, s := range All {
		for _, k := range s.names() {
			if k == name {
				return s, true
			}
		}
	}
	return nil, false
}
