package jobenv

import (
	"fmt"
	"strconv"
	"strings"
)

// ExpandNodelist expands Slurm's compressed host list syntax, as in SLURM_STEP_NODELIST:
// "node[01-03,07],gpu5" -> node01 node02 node03 node07 gpu5. Zero padding of a range is kept
// (01-10 gives 01..10), several bracket groups in one name multiply ("r[1-2]n[1-2]"), and hosts
// keep their order. Limits guard against a typo that would expand to millions of names.
func ExpandNodelist(s string) ([]string, error) {
	var out []string
	for _, item := range splitTop(s) {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		names, err := expandItem(item)
		if err != nil {
			return nil, fmt.Errorf("nodelist %q: %w", s, err)
		}
		out = append(out, names...)
		if len(out) > maxNodes {
			return nil, fmt.Errorf("nodelist %q: more than %d hosts", s, maxNodes)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("nodelist %q names no hosts", s)
	}
	return out, nil
}

const maxNodes = 1 << 16

// splitTop splits on commas that are not inside brackets.
func splitTop(s string) []string {
	var parts []string
	depth, start := 0, 0
	for i, c := range s {
		switch c {
		case '[':
			depth++
		case ']':
			depth--
		case ',':
			if depth == 0 {
				parts = append(parts, s[start:i])
				start = i + 1
			}
		}
	}
	return append(parts, s[start:])
}

func expandItem(item string) ([]string, error) {
	open := strings.IndexByte(item, '[')
	if open < 0 {
		if strings.ContainsAny(item, "]") {
			return nil, fmt.Errorf("unmatched ']' in %q", item)
		}
		return []string{item}, nil
	}
	end := strings.IndexByte(item[open:], ']')
	if end < 0 {
		return nil, fmt.Errorf("unclosed '[' in %q", item)
	}
	end += open
	prefix, body, rest := item[:open], item[open+1:end], item[end+1:]
	var values []string
	for _, r := range strings.Split(body, ",") {
		lo, hi, isRange := strings.Cut(r, "-")
		if !isRange {
			if _, err := strconv.Atoi(lo); err != nil {
				return nil, fmt.Errorf("%q in %q is not a number", lo, item)
			}
			values = append(values, lo)
			continue
		}
		a, err1 := strconv.Atoi(lo)
		b, err2 := strconv.Atoi(hi)
		if err1 != nil || err2 != nil || b < a {
			return nil, fmt.Errorf("bad range %q in %q", r, item)
		}
		if b-a > maxNodes {
			return nil, fmt.Errorf("range %q in %q is too large", r, item)
		}
		for v := a; v <= b; v++ {
			values = append(values, fmt.Sprintf("%0*d", len(lo), v))
		}
	}
	tails, err := expandItem(rest)
	if rest == "" {
		tails, err = []string{""}, nil
	}
	if err != nil {
		return nil, err
	}
	if len(values)*len(tails) > maxNodes {
		return nil, fmt.Errorf("%q expands to more than %d hosts", item, maxNodes)
	}
	var out []string
	for _, v := range values {
		for _, t := range tails {
			out = append(out, prefix+v+t)
		}
	}
	return out, nil
}
