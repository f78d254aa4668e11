package settings

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// root is the module's root, from this package's directory.
const root = "../.."

// The README's settings table is the one Table writes from the declarations: after changing a
// declaration, run go run ./internal/settings/gen.
func TestReadmeTable(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	want, err := WithTable(string(doc))
	if err != nil {
		t.Fatal(err)
	}
	if want != string(doc) {
		t.Errorf("README.md's settings table is not the declarations' (internal/settings/registry.go): run go run ./internal/settings/gen from the module's root")
	}
}

// mentions are names that shipped code writes but that are no variable kolo reads: each says why.
var mentions = map[string]string{
	"KOLO_ALLREDUCE":               "a timeline label (engine/timeline.go), not a variable",
	"HOROVOD_GPU":                  "the prefix of Horovod's HOROVOD_GPU_* variables, in a comment",
	"HOROVOD_DYNAMIC_PROCESS_SETS": "Horovod's setting, named in a docstring to say kolo needs none",
}

var varName = regexp.MustCompile(`\b(KOLO|HOROVOD)_[A-Z0-9_]*[A-Z0-9]`)

// shipped calls f with each of the module's shipped Go and Python files (tests, test data and
// this package aside) and its text.
func shipped(t *testing.T, f func(rel, text string)) {
	t.Helper()
	skipDir := map[string]bool{".git": true, ".venv": true, "testdata": true, "bin": true, "build": true, "dist": true,
		"node_modules": true, "__pycache__": true, "settings": true}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if path != root && (skipDir[d.Name()] || rel == filepath.Join("python", "tests")) {
				return filepath.SkipDir
			}
			return nil
		}
		name := d.Name()
		switch {
		case strings.HasSuffix(name, ".go") && !strings.HasSuffix(name, "_test.go"):
		case strings.HasSuffix(name, ".py") && !strings.HasPrefix(name, "test_") && name != "conftest.py":
		default:
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		f(rel, string(b))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Every KOLO_* or HOROVOD_* name in kolo's shipped Go and Python code is declared here: a
// variable read anywhere else would be parsed by hand, and missing from the pre-start check and
// the README's table.
func TestEveryVariableDeclared(t *testing.T) {
	found := map[string][]string{} // name -> files
	shipped(t, func(rel, text string) {
		for _, m := range varName.FindAllString(text, -1) {
			if !slices.Contains(found[m], rel) {
				found[m] = append(found[m], rel)
			}
		}
	})
	if len(found) < 20 {
		t.Fatalf("found only %d names under %s: is the walk looking at the module?", len(found), root)
	}
	for name, files := range found {
		if _, ok := Find(name); ok {
			continue
		}
		if _, ok := mentions[name]; ok {
			continue
		}
		t.Errorf("%s (in %s) is not declared in internal/settings/registry.go: declare it, and read it through its declaration", name, strings.Join(files, ", "))
	}
	for name := range mentions {
		if _, ok := found[name]; !ok {
			t.Errorf("mentions lists %s, which no shipped file names any more", name)
		}
	}
}

var quotedName = regexp.MustCompile(`"(KOLO|HOROVOD)_[A-Z0-9_]*[A-Z0-9]"`)

// Go code names a variable through its declaration (settings.X.Name), never as a string of its
// own: a second spelling is a second declaration, which the next rename misses. (Python cannot
// import the declarations; TestEveryVariableDeclared covers it.)
func TestGoNamesTheDeclarations(t *testing.T) {
	shipped(t, func(rel, text string) {
		if !strings.HasSuffix(rel, ".go") {
			return
		}
		for _, m := range quotedName.FindAllString(text, -1) {
			t.Errorf("%s spells %s: use its declaration's Name in package settings", rel, m)
		}
	})
}

// Each name, and each Horovod spelling, is declared once.
func TestDeclaredOnce(t *testing.T) {
	seen := map[string]bool{}
	for _, s := range All {
		if s.Help == "" {
			t.Errorf("%s has no help line", s.Name)
		}
		for _, k := range s.names() {
			if seen[k] {
				t.Errorf("%s is declared twice", k)
			}
			seen[k] = true
		}
		if s.Kind == Duration && s.Unit == 0 {
			t.Errorf("%s: a duration without the unit of a bare number", s.Name)
		}
	}
}

func TestReaders(t *testing.T) {
	s := &Setting{Name: "KOLO_X", Horovod: []string{"HOROVOD_X"}, Kind: Duration, Unit: time.Second}
	for _, tc := range []struct {
		name string
		env  map[string]string
		read func(getenv func(string) string) (any, error)
		want any
		err  string // in the error; "unset": ErrUnset
	}{
		{"unset", nil, func(g func(string) string) (any, error) { return s.Duration(g) }, time.Duration(0), "unset"},
		{"spaces only", map[string]string{"KOLO_X": "  "}, func(g func(string) string) (any, error) { return s.Duration(g) }, time.Duration(0), "unset"},
		{"bare seconds", map[string]string{"KOLO_X": "1.5"}, func(g func(string) string) (any, error) { return s.Duration(g) }, 1500 * time.Millisecond, ""},
		{"a Go duration", map[string]string{"KOLO_X": "60s"}, func(g func(string) string) (any, error) { return s.Duration(g) }, time.Minute, ""},
		{"Horovod's spelling", map[string]string{"HOROVOD_X": "2"}, func(g func(string) string) (any, error) { return s.Duration(g) }, 2 * time.Second, ""},
		{"kolo's wins", map[string]string{"KOLO_X": "3", "HOROVOD_X": "2"}, func(g func(string) string) (any, error) { return s.Duration(g) }, 3 * time.Second, ""},
		{"negative", map[string]string{"HOROVOD_X": "-1s"}, func(g func(string) string) (any, error) { return s.Duration(g) }, time.Duration(0), `HOROVOD_X="-1s": want a duration`},
		{"bytes", map[string]string{"KOLO_X": "64MiB"}, func(g func(string) string) (any, error) { return s.Bytes(g) }, int64(64 << 20), ""},
		{"too many bytes", map[string]string{"KOLO_X": "2048GiB"}, func(g func(string) string) (any, error) { return s.Bytes(g) }, int64(0), "more than kolo handles"},
		{"count", map[string]string{"KOLO_X": "-2"}, func(g func(string) string) (any, error) { return s.Count(g) }, 0, "want a non-negative integer"},
		{"switch", map[string]string{"KOLO_X": "Yes"}, func(g func(string) string) (any, error) { return s.Switch(g) }, true, ""},
		{"not a switch", map[string]string{"KOLO_X": "maybe"}, func(g func(string) string) (any, error) { return s.Switch(g) }, false, `KOLO_X="maybe"`},
		{"bool", map[string]string{"KOLO_X": "on"}, func(g func(string) string) (any, error) { return s.Bool(g) }, false, "want true/false/1/0"},
		{"fraction", map[string]string{"KOLO_X": "1.5"}, func(g func(string) string) (any, error) { return s.Fraction(g) }, 0.0, "want a number in [0, 1]"},
		{"seconds", map[string]string{"KOLO_X": "0"}, func(g func(string) string) (any, error) { return s.Seconds(g) }, time.Duration(0), "want a positive number of seconds"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.read(Env(tc.env))
			switch {
			case tc.err == "unset":
				if !errors.Is(err, ErrUnset) {
					t.Fatalf("err %v, want ErrUnset", err)
				}
			case tc.err != "":
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want one with %q", err, tc.err)
				}
			case err != nil || got != tc.want:
				t.Fatalf("%v (%T), %v; want %v (%T)", got, got, err, tc.want, tc.want)
			}
		})
	}
}

// A choice takes its values in any case and returns the declared spelling; Horovod's spellings
// have their own values where declared so.
func TestChoice(t *testing.T) {
	for _, tc := range []struct {
		env       map[string]string
		key, want string
		err       bool
	}{
		{map[string]string{"KOLO_NCCL": "AUTO"}, "KOLO_NCCL", "auto", false},
		{map[string]string{"HOROVOD_GPU_ALLREDUCE": "nccl"}, "HOROVOD_GPU_ALLREDUCE", "NCCL", false},
		{map[string]string{"HOROVOD_GPU_OPERATIONS": "1"}, "HOROVOD_GPU_OPERATIONS", "1", true},
		{map[string]string{"KOLO_NCCL": "NCCL"}, "KOLO_NCCL", "NCCL", true},
	} {
		k, v, err := NCCL.Choice(Env(tc.env))
		if k != tc.key || v != tc.want || (err != nil) != tc.err {
			t.Errorf("%v: %s=%s, %v; want %s=%s, error %v", tc.env, k, v, err, tc.key, tc.want, tc.err)
		}
	}
}

// Check names every malformed setting a user set, and nothing the launcher sets.
func TestCheck(t *testing.T) {
	errs := Check(Env(map[string]string{"KOLO_CYCLE_TIME": "soon", "HOROVOD_CACHE_CAPACITY": "-1", "KOLO_LOG_LEVEL": "loud",
		"KOLO_FUSION_THRESHOLD": "64MiB", "KOLO_RANK": "x"}))
	var got []string
	for _, err := range errs {
		got = append(got, err.Error())
	}
	all := strings.Join(got, "\n")
	for _, want := range []string{`KOLO_CYCLE_TIME="soon"`, `HOROVOD_CACHE_CAPACITY="-1"`, `KOLO_LOG_LEVEL="loud"`} {
		if !strings.Contains(all, want) {
			t.Errorf("Check: %q, want %s named", got, want)
		}
	}
	if len(errs) != 3 {
		t.Errorf("Check: %d errors %q, want 3", len(errs), got)
	}
}
