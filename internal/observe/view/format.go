package view

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// dur writes a duration the way people read a status line: "0.35 ms", "41 ms", "2.5 s", "61 s",
// "12m05s".
func dur(d time.Duration) string {
	neg := ""
	if d < 0 {
		neg, d = "-", -d
	}
	var s string
	switch {
	case d < time.Millisecond:
		s = fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond))
	case d < time.Second:
		s = fmt.Sprintf("%d ms", d/time.Millisecond)
	case d < 10*time.Second:
		s = fmt.Sprintf("%.1f s", d.Seconds())
	case d < 10*time.Minute:
		s = fmt.Sprintf("%d s", d/time.Second)
	default:
		d = d.Round(time.Second)
		s = fmt.Sprintf("%dm%02ds", d/time.Minute, (d%time.Minute)/time.Second)
	}
	return neg + s
}

// bytesSI writes a byte count in decimal units: "512 B", "3.2 GB".
func bytesSI(n uint64) string {
	if n < 1000 {
		return fmt.Sprintf("%d B", n)
	}
	v := float64(n)
	for _, u := range []string{"kB", "MB", "GB", "TB"} {
		v /= 1000
		if v < 1000 {
			return fmt.Sprintf("%.1f %s", v, u)
		}
	}
	return fmt.Sprintf("%.1f PB", v/1000)
}

// rankList writes ranks compactly: "rank 5", "ranks 0-3, 6", and past limit entries "... (N in
// all)". ranks must be ascending.
func rankList(ranks []int, limit int) string {
	if len(ranks) == 1 {
		return "rank " + strconv.Itoa(ranks[0])
	}
	var parts []string
	for i := 0; i < len(ranks); {
		j := i
		for j+1 < len(ranks) && ranks[j+1] == ranks[j]+1 {
			j++
		}
		if j == i {
			parts = append(parts, strconv.Itoa(ranks[i]))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", ranks[i], ranks[j]))
		}
		i = j + 1
	}
	s := "ranks " + strings.Join(parts[:min(len(parts), limit)], ", ")
	if len(parts) > limit {
		s += fmt.Sprintf(", ... (%d in all)", len(ranks))
	}
	return s
}

// percent writes a fraction as a whole percentage.
func percent(f float64) string { return fmt.Sprintf("%.0f%%", 100*f) }
