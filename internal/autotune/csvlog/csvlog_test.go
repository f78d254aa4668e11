package csvlog

import (
	"bytes"
	"errors"
	"io"
	"math"
	"reflect"
	"strings"
	"testing"
)

var names = []string{"fusion_threshold_bytes", "cycle_time_ms", "hierarchical_allreduce", "note"}

func settings(fusion, cycle, hier, note string) map[string]string {
	return map[string]string{names[0]: fusion, names[1]: cycle, names[2]: hier, names[3]: note}
}

func sameRow(a, b Row) bool {
	f := func(x, y float64) bool { return x == y || math.IsNaN(x) && math.IsNaN(y) }
	return a.Sample == b.Sample && a.Step == b.Step && reflect.DeepEqual(a.Settings, b.Settings) &&
		a.Role == b.Role && f(a.StepTime, b.StepTime) && f(a.Speedup, b.Speedup) &&
		f(a.CILow, b.CILow) && f(a.CIHigh, b.CIHigh)
}

// readChosen is the settings of the log's last Chosen row: a tuner run again on the same log
// appends a newer decision.
func readChosen(r io.Reader) (map[string]string, error) {
	l, err := Read(r)
	if err != nil {
		return nil, err
	}
	for i := len(l.Rows) - 1; i >= 0; i-- {
		if l.Rows[i].Role == Chosen {
			return l.Rows[i].Settings, nil
		}
	}
	return nil, ErrNoDecision
}

func TestRoundTrip(t *testing.T) {
	nan := math.NaN()
	samples := []Row{
		{Sample: 0, Step: 120, Settings: settings("67108864", "5", "0", ""), StepTime: 0.2501, Role: Default, Speedup: nan, CILow: nan, CIHigh: nan},
		// Values with the CSV's own delimiters must survive.
		{Sample: 1, Step: 140, Settings: settings("8388608", "2.5", "1", `a, "quoted" note`), StepTime: 0.2333, Role: Candidate, Speedup: 1.072, CILow: nan, CIHigh: nan},
		{Sample: 2, Step: 160, Settings: settings("67108864", "5", "0", "# not a comment"), StepTime: 0.2499, Role: Default, Speedup: nan, CILow: nan, CIHigh: nan},
		{Sample: 3, Step: 180, Settings: settings("8388608", "2.5", "1", "multi\nline"), StepTime: 0.2331, Role: Candidate, Speedup: 1.0718, CILow: 1.04, CIHigh: 1.1},
	}
	chosen := Row{Sample: -1, Step: 180, Settings: settings("8388608", "2.5", "1", ""), StepTime: nan, Role: Chosen, Speedup: 1.0718, CILow: 1.04, CIHigh: 1.1}

	var buf bytes.Buffer
	w, err := NewWriter(&buf, names)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range samples {
		if err := w.Sample(r); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Chosen(chosen); err != nil {
		t.Fatal(err)
	}
	text := buf.String()
	if !strings.HasPrefix(text, Comment+"\nsample,step,fusion_threshold_bytes,cycle_time_ms,hierarchical_allreduce,note,step_time_s,role,speedup,ci_low,ci_high\n") {
		t.Errorf("log starts\n%s", text)
	}

	l, err := Read(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(l.Settings, names) {
		t.Errorf("settings %q, want %q", l.Settings, names)
	}
	want := append(append([]Row(nil), samples...), chosen)
	if len(l.Rows) != len(want) {
		t.Fatalf("%d rows, want %d", len(l.Rows), len(want))
	}
	for i := range want {
		if !sameRow(l.Rows[i], want[i]) {
			t.Errorf("row %d: %+v, want %+v", i, l.Rows[i], want[i])
		}
	}
	got, err := readChosen(strings.NewReader(text))
	if err != nil || !reflect.DeepEqual(got, chosen.Settings) {
		t.Errorf("readChosen = %v, %v; want %v", got, err, chosen.Settings)
	}
}

// TestNoDecision: the job ended during warm-up (header only) or mid-tuning (samples, no decision).
func TestNoDecision(t *testing.T) {
	tests := []struct {
		name    string
		samples int
	}{
		{"ended during warm-up", 0},
		{"ended mid-tuning", 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			w, err := NewWriter(&buf, []string{"cache"})
			if err != nil {
				t.Fatal(err)
			}
			for i := range tc.samples {
				if err := w.Sample(Row{Sample: i, Step: int64(10 * i), Settings: map[string]string{"cache": "1"}, StepTime: 0.1, Role: Default}); err != nil {
					t.Fatal(err)
				}
			}
			l, err := Read(bytes.NewReader(buf.Bytes()))
			if err != nil {
				t.Fatal(err)
			}
			if len(l.Rows) != tc.samples {
				t.Errorf("%d rows, want %d", len(l.Rows), tc.samples)
			}
			if _, err := readChosen(bytes.NewReader(buf.Bytes())); !errors.Is(err, ErrNoDecision) {
				t.Errorf("readChosen: %v, want ErrNoDecision", err)
			}
		})
	}
}

// recorder is a writer whose contents are checked between calls: what is written must be there
// without any Close or Flush by the caller.
type recorder struct{ bytes.Buffer }

func TestFlushesEveryRow(t *testing.T) {
	var rec recorder
	w, err := NewWriter(&rec, []string{"cache"})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(rec.String(), "\n"); got != 2 {
		t.Fatalf("after NewWriter: %d lines written, want 2 (comment, header)", got)
	}
	for i := range 3 {
		if err := w.Sample(Row{Sample: i, Settings: map[string]string{"cache": "0"}, StepTime: 1, Role: Candidate}); err != nil {
			t.Fatal(err)
		}
		if got := strings.Count(rec.String(), "\n"); got != 3+i {
			t.Fatalf("after sample %d: %d lines written, want %d", i, got, 3+i)
		}
	}
}

func TestLastDecisionWins(t *testing.T) {
	var buf bytes.Buffer
	w, err := NewWriter(&buf, []string{"cache"})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"0", "1"} {
		if err := w.Chosen(Row{Settings: map[string]string{"cache": v}, StepTime: math.NaN(), Speedup: 1}); err != nil {
			t.Fatal(err)
		}
	}
	got, err := readChosen(&buf)
	if err != nil || got["cache"] != "1" {
		t.Errorf("readChosen = %v, %v; want cache=1", got, err)
	}
}

type failingWriter struct{ after int }

func (f *failingWriter) Write(p []byte) (int, error) {
	if f.after <= 0 {
		return 0, errors.New("disk full")
	}
	f.after--
	return len(p), nil
}

func TestWriteErrors(t *testing.T) {
	good := map[string]string{"cache": "1"}
	tests := []struct {
		name  string
		names []string
		w     *failingWriter
		row   Row
	}{
		{"empty name", []string{""}, &failingWriter{9}, Row{}},
		{"padded name", []string{" cache"}, &failingWriter{9}, Row{}},
		{"duplicate name", []string{"cache", "cache"}, &failingWriter{9}, Row{}},
		{"name of a fixed column", []string{"role"}, &failingWriter{9}, Row{}},
		{"header write fails", []string{"cache"}, &failingWriter{0}, Row{}},
		{"row write fails", []string{"cache"}, &failingWriter{2}, Row{Settings: good, StepTime: 1, Role: Default}},
		{"missing setting", []string{"cache"}, &failingWriter{9}, Row{Settings: map[string]string{"other": "1"}, StepTime: 1, Role: Default}},
		{"extra setting", []string{"cache"}, &failingWriter{9}, Row{Settings: map[string]string{"cache": "1", "x": "2"}, StepTime: 1, Role: Default}},
		{"chosen role as a sample", []string{"cache"}, &failingWriter{9}, Row{Settings: good, StepTime: 1, Role: Chosen}},
		{"no role", []string{"cache"}, &failingWriter{9}, Row{Settings: good, StepTime: 1}},
		{"negative sample number", []string{"cache"}, &failingWriter{9}, Row{Sample: -1, Settings: good, StepTime: 1, Role: Default}},
		{"zero step time", []string{"cache"}, &failingWriter{9}, Row{Settings: good, StepTime: 0, Role: Default}},
		{"NaN step time", []string{"cache"}, &failingWriter{9}, Row{Settings: good, StepTime: math.NaN(), Role: Default}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w, err := NewWriter(tc.w, tc.names)
			if err != nil {
				return
			}
			if tc.row.Settings == nil {
				t.Fatalf("NewWriter accepted %q", tc.names)
			}
			if err := w.Sample(tc.row); err == nil {
				t.Errorf("Sample(%+v) accepted", tc.row)
			}
		})
	}
}

func TestReadRejects(t *testing.T) {
	header := Comment + "\nsample,step,cache,step_time_s,role,speedup,ci_low,ci_high\n"
	tests := []struct {
		name, text string
		notLog     bool
	}{
		{"empty", "", true},
		{"no comment", "sample,step,cache,step_time_s,role,speedup,ci_low,ci_high\n", true},
		{"comment only", Comment + "\n", true},
		{"someone else's csv", Comment + "\na,b,c\n", true},
		{"duplicate setting column", Comment + "\nsample,step,x,x,step_time_s,role,speedup,ci_low,ci_high\n", true},
		{"short row", header + "0,10,1,0.5,default\n", false},
		{"unknown role", header + "0,10,1,0.5,baseline,,,\n", false},
		{"bad sample number", header + "x,10,1,0.5,default,,,\n", false},
		{"chosen with a sample number", header + "3,10,1,,chosen,1.1,,\n", false},
		{"bad step", header + "0,ten,1,0.5,default,,,\n", false},
		{"bad step time", header + "0,10,1,fast,default,,,\n", false},
		{"missing step time", header + "0,10,1,,default,,,\n", false},
		{"negative step time", header + "0,10,1,-0.5,default,,,\n", false},
		{"bad speedup", header + "0,10,1,0.5,candidate,x,,\n", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Read(strings.NewReader(tc.text))
			if err == nil {
				t.Fatal("accepted")
			}
			if errors.Is(err, ErrNotLog) != tc.notLog {
				t.Errorf("%v: ErrNotLog is %v, want %v", err, !tc.notLog, tc.notLog)
			}
		})
	}
	// A log written by hand, with Windows line ends and a later comment, still reads.
	text := strings.ReplaceAll(header+"# tuning started\n0,10,1,0.5,default,,,\n,10,1,,chosen,,,\n", "\n", "\r\n")
	if got, err := readChosen(strings.NewReader(text)); err != nil || got["cache"] != "1" {
		t.Errorf("CRLF log: %v, %v", got, err)
	}
}

func FuzzRead(f *testing.F) {
	var buf bytes.Buffer
	w, _ := NewWriter(&buf, []string{"a", "b"})
	_ = w.Sample(Row{Sample: 0, Step: 1, Settings: map[string]string{"a": "1", "b": "x,y"}, StepTime: 0.5, Role: Default, Speedup: math.NaN(), CILow: math.NaN(), CIHigh: math.NaN()})
	_ = w.Chosen(Row{Step: 2, Settings: map[string]string{"a": "1", "b": "2"}, StepTime: math.NaN(), Speedup: 1.1, CILow: 1, CIHigh: 1.2})
	f.Add(buf.String())
	f.Add(Comment + "\n")
	f.Fuzz(func(t *testing.T, text string) {
		l, err := Read(strings.NewReader(text))
		if err != nil {
			return
		}
		// Whatever reads must write back and read the same.
		var out bytes.Buffer
		w, err := NewWriter(&out, l.Settings)
		if err != nil {
			t.Fatalf("settings %q read but not writable: %v", l.Settings, err)
		}
		for _, r := range l.Rows {
			if r.Role == Chosen {
				err = w.Chosen(r)
			} else {
				err = w.Sample(r)
			}
			if err != nil {
				t.Fatalf("row %+v read but not writable: %v", r, err)
			}
		}
		again, err := Read(&out)
		if err != nil {
			t.Fatalf("rewritten log does not read: %v\n%s", err, out.String())
		}
		if len(again.Rows) != len(l.Rows) {
			t.Fatalf("%d rows, rewritten %d", len(l.Rows), len(again.Rows))
		}
		for i := range l.Rows {
			if !sameRow(l.Rows[i], again.Rows[i]) {
				t.Fatalf("row %d: %+v rewritten as %+v", i, l.Rows[i], again.Rows[i])
			}
		}
	})
}

// TestAppend: a second writer appends to a log without a header, and the whole reads as one log,
// rows in file order, the last decision the newest.
func TestAppend(t *testing.T) {
	nan := math.NaN()
	var buf bytes.Buffer
	w, err := NewWriter(&buf, names)
	if err != nil {
		t.Fatal(err)
	}
	first := Row{Step: 50, Settings: settings("1", "0", "0", "round 1"), StepTime: 0.1, Role: Default, Speedup: nan, CILow: nan, CIHigh: nan}
	if err := w.Sample(first); err != nil {
		t.Fatal(err)
	}
	a, err := AppendWriter(&buf, names)
	if err != nil {
		t.Fatal(err)
	}
	second := Row{Step: 20, Settings: settings("2", "0", "0", "round 2"), StepTime: 0.2, Role: Default, Speedup: nan, CILow: nan, CIHigh: nan}
	if err := a.Sample(second); err != nil {
		t.Fatal(err)
	}
	chosen := Row{Sample: -1, Step: 30, Settings: settings("2", "0", "0", ""), StepTime: nan, Role: Chosen, Speedup: 1, CILow: nan, CIHigh: nan}
	if err := a.Chosen(chosen); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(buf.String(), "sample,step"); n != 1 {
		t.Errorf("%d headers:\n%s", n, buf.String())
	}
	l, err := Read(strings.NewReader(buf.String()))
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Rows) != 3 || !sameRow(l.Rows[0], first) || !sameRow(l.Rows[1], second) || !sameRow(l.Rows[2], chosen) {
		t.Errorf("rows %+v", l.Rows)
	}
	if _, err := AppendWriter(&buf, []string{"step"}); err == nil {
		t.Error("AppendWriter took a fixed column's name")
	}
}
