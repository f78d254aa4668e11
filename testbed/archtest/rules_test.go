package archtest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"maps"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// A rule binds every package that Pkgs matches to what its package comment (or docs/design.md, where
// Why says so) forbids. Patterns are Go's: "./x" is the kolo package x ("." the root package),
// "./x/..." is x and every package under it, "net" a standard package, "..." anything.
type rule struct {
	Pkgs    string
	Except  string   // a pattern of packages Pkgs matches that the rule leaves alone
	Why     string   // the comment's words, printed when the rule is broken
	Imports []string // none of the package's own imports matches these
	Deps    []string // none of the packages it depends on, directly or not, matches these
	Uses    []string // its files name none of these (importpath.Name; "go": no go statement)
}

// clock is what reading the time or waiting on it looks like; a pure package takes time as an
// argument instead.
var clock = []string{"time.Now", "time.Since", "time.Until", "time.Sleep", "time.After",
	"time.AfterFunc", "time.Tick", "time.NewTimer", "time.NewTicker"}

// pure is clock plus goroutines.
var pure = append([]string{"go"}, clock...)

// rules is one entry per package comment's checkable "must not". To add a package, add its entry
// here with the sentence from its comment; a package comment's rule that no import, dependency or
// name can show (auth never logs the secret, netif sends no traffic) is left to review.
var rules = []rule{
	{
		Pkgs:    ".",
		Why:     "This package is a thin layer over the engine: it must not contain negotiation or transport logic.",
		Imports: []string{"net", "./internal/transport/tcp", "./internal/transport/shm", "./internal/transport/inmem", "./internal/sockopt", "./internal/accept"},
	},
	{
		Pkgs:    "./internal/autotune",
		Why:     "The package is pure: no goroutines, no clock (the caller passes the time), no engine imports, no files.",
		Imports: []string{"os"},
		Deps:    []string{"./internal/engine/...", "net"},
		Uses:    pure,
	},
	{
		Pkgs: "./internal/autotune/bayes",
		Why:  "The package is pure: it never measures anything, reads a clock or touches the engine.",
		Deps: []string{"./internal/engine/..."},
		Uses: clock,
	},
	{
		Pkgs:    "./internal/autotune/csvlog",
		Why:     "The package formats and parses only: the caller opens, syncs and closes files.",
		Imports: []string{"os"},
	},
	{
		Pkgs: "./internal/autotune/decide",
		Why:  "The package does arithmetic only: the caller measures.",
		Uses: clock,
	},
	{
		Pkgs: "./internal/bench",
		Why:  "It runs inside an initialised kolo process (one per rank); the kolo CLI starts the ranks. It must not start processes itself.",
		Deps: []string{"os/exec"},
		Uses: []string{"os.StartProcess", "syscall.ForkExec", "syscall.Exec"},
	},
	{
		Pkgs: "./internal/bootstrap",
		Why:  "It does not connect ranks to each other; that is package world's job.",
		Deps: []string{"./internal/world", "./internal/transport/..."},
	},
	{
		Pkgs:    "./capi",
		Why:     "It must stay thin: argument conversion and the handle table only; logic belongs in package kolo or the engine.",
		Imports: []string{"./internal/engine/negotiate", "./internal/collective", "./internal/transport/...", "./internal/world", "./internal/rendezvous", "./internal/bootstrap", "./internal/launch/..."},
	},
	{
		Pkgs:    "./internal/collective",
		Why:     "The package must not open connections, name tensors, fuse, negotiate, or log: it moves and reduces the bytes it is handed, over the Comm it is handed.",
		Imports: []string{"log", "log/slog"},
		Deps:    []string{"net", "./internal/transport/tcp", "./internal/engine/...", "./internal/world", "./internal/rendezvous"},
		Uses:    []string{"fmt.Print", "fmt.Printf", "fmt.Println"},
	},
	{
		Pkgs: "./internal/dtype",
		Why:  "It must not depend on any other kolo package.",
		Deps: []string{"./..."},
	},
	{
		Pkgs:    "./internal/engine",
		Why:     "It must not implement collective algorithms (package collective) or move bytes itself (package transport).",
		Imports: []string{"./internal/transport/tcp", "./internal/transport/shm", "./internal/transport/inmem"},
		Deps:    []string{"net"},
	},
	{
		Pkgs:    "./internal/engine/negotiate",
		Why:     "The package must stay pure (etcd-raft style): no sockets, no goroutines, no clocks (time is an argument), no logging; the engine moves the messages.",
		Imports: []string{"os", "log", "log/slog"},
		Deps:    []string{"net", "os/exec", "./internal/transport/...", "./internal/collective"},
		Uses:    pure,
	},
	{
		Pkgs:   "./...",
		Except: "./testbed/...",
		Why:    "testbed/ is test harness (scenarios, fake processes, a stand-in NCCL): only tests import it, and what ships never depends on it.",
		Deps:   []string{"./testbed/..."},
	},
	{
		Pkgs:    "./internal/observe/flight",
		Why:     "The recorder must not interpret what it records: no formatting for people, no I/O.",
		Imports: []string{"os", "log", "log/slog"},
		Deps:    []string{"net", "golang.org/x/term"},
	},
	{
		Pkgs:    "./internal/observe/report",
		Why:     "The package moves and counts; it must not decide and must not do I/O: callers put the bytes where they go.",
		Imports: []string{"os"},
		Deps:    []string{"net", "./internal/rendezvous", "golang.org/x/term"},
	},
	{
		Pkgs:    "./internal/observe/straggle",
		Why:     "It must not decide anything about the job (fail it, reorder ops): it only observes, purely.",
		Imports: []string{"os"},
		Deps:    []string{"net", "./internal/engine", "./internal/transport"},
		Uses:    pure,
	},
	{
		Pkgs: "./internal/jobenv",
		Why:  "It is pure: Encode and Decode work on plain maps. It must not start processes or open connections.",
		Deps: []string{"net", "os/exec"},
		Uses: []string{"os.StartProcess", "syscall.ForkExec", "syscall.Exec"},
	},
	{
		Pkgs: "./internal/launch/...",
		Why:  "This package must not know about tensors or the engine.",
		Deps: []string{"./internal/engine/...", "./internal/collective", "./internal/reduce", "./internal/dtype", ".", "./internal/world", "./capi", "./internal/timeline"},
	},
	{
		Pkgs: "./internal/launch/proc",
		Why:  "It must not plan ranks, host a rendezvous or know what a job is (static, no-ssh, elastic): those are launch's; a Starter gets a complete Worker and only runs it.",
		Deps: []string{"./internal/launch", "./internal/launch/flags", "./internal/launch/elastic", "./internal/rendezvous"},
	},
	{
		Pkgs: "./internal/launch/layout",
		Why:  "It must not start processes, read the network or the clock: everything here is a pure function with table tests.",
		Deps: []string{"./internal/launch", "./internal/launch/proc", "net", "os/exec"},
		Uses: pure,
	},
	{
		Pkgs: "./internal/launch/flags",
		Why:  "It must not start processes, reach the network or decide how a job runs: it says what was asked, and launch acts on it.",
		Deps: []string{"./internal/launch", "./internal/launch/proc", "./internal/rendezvous", "os/exec"},
		Uses: pure,
	},
	{
		Pkgs:    "./internal/launch/elastic",
		Why:     "It is the pure planning core of kolo run's elastic mode: no processes, no sockets, no goroutines, no clock and no logging. The package must not import launch.",
		Imports: []string{"os", "log", "log/slog"},
		Deps:    []string{"./internal/launch", "net", "os/exec"},
		Uses:    pure,
	},
	{
		Pkgs:    "./internal/reduce",
		Why:     "The package must not allocate on the hot path, block, log, or know anything about ranks, transports or tensors' owners.",
		Imports: []string{"log", "log/slog"},
		Deps:    []string{"./internal/transport/...", "./internal/collective", "./internal/engine/...", "./internal/world"},
	},
	{
		Pkgs:    "./internal/settings",
		Why:     "It imports no kolo package, so that every package can read its settings here, and it must not act on a setting.",
		Imports: []string{"os", "log", "log/slog"},
		Deps:    []string{"./..."},
	},
	{
		Pkgs: "./internal/timeline",
		Why:  "It must not know about the engine's types: callers pass names and strings.",
		Deps: []string{"./internal/engine/..."},
	},
	{
		Pkgs: "./internal/transport/...",
		Why:  "This package must not know about tensors, ops or the engine: it moves bytes between numbered ranks and says who failed.",
		Deps: []string{"./internal/engine/...", "./internal/collective", "./internal/reduce", "./internal/dtype", ".", "./internal/world", "./capi", "./internal/timeline"},
	},
	{
		Pkgs:    "./internal/transport/...",
		Why:     "docs/design.md: the transport knows nothing of elastic training (a re-formed world is a new world; its rounds are the launcher's, jobenv's and the rendezvous').",
		Imports: []string{"./internal/jobenv"},
		Deps:    []string{"./internal/launch/...", "./internal/rendezvous", "./internal/bootstrap"},
	},
	{
		Pkgs:    "./internal/transport/inmem",
		Why:     "It must not be used between processes.",
		Imports: []string{"os", "os/exec", "syscall"},
		Deps:    []string{"net"},
	},
	{
		Pkgs:    "./internal/transport/shm",
		Why:     "This package must not talk to other hosts: it moves bytes between local ranks.",
		Imports: []string{"./internal/transport/tcp"},
		Deps:    []string{"net"},
	},
	{
		Pkgs:    "./internal/version",
		Why:     "It imports nothing so that any package (the launcher included) can use it without pulling in the engine.",
		Imports: []string{"..."},
	},
	{
		Pkgs: "./internal/world",
		Why:  "It owns connection set-up and tear-down only. It must not run collectives or know about tensors.",
		Deps: []string{"./internal/collective", "./internal/engine/...", "./internal/reduce", "./internal/dtype"},
	},
}

// pkg is what the rules look at in one package: what `go list` says of it, and its parsed files.
type pkg struct {
	ImportPath string
	Name       string
	Dir        string
	GoFiles    []string
	CgoFiles   []string
	Imports    []string
	Deps       []string
	Standard   bool
	DepOnly    bool
	files      []*ast.File
}

func TestPackageRules(t *testing.T) {
	module, all := listPackages(t)
	for _, p := range all {
		if p.Standard || p.DepOnly || !strings.HasPrefix(p.ImportPath, module) {
			continue
		}
		p.files = parseFiles(t, p)
	}
	for _, v := range check(module, rules, all) {
		t.Error(v)
	}
}

// check returns every way pkgs break rules, each naming the package, what it should not have,
// how it comes to have it and the rule's words. A rule that matches no package is broken too: its
// package was moved or renamed, and the rule must follow it.
func check(module string, rules []rule, pkgs map[string]*pkg) []string {
	var bad []string
	for _, r := range rules {
		matched := false
		for _, path := range slices.Sorted(maps.Keys(pkgs)) {
			p := pkgs[path]
			if p.Standard || p.DepOnly || !match(module, r.Pkgs, path) || r.Except != "" && match(module, r.Except, path) {
				continue
			}
			matched = true
			rel := relative(module, path)
			for _, imp := range p.Imports {
				if matchAny(module, r.Imports, imp) {
					bad = append(bad, fmt.Sprintf("%s imports %s; rule for %s: %s", rel, relative(module, imp), r.Pkgs, r.Why))
				}
			}
			for _, dep := range p.Deps {
				if dep != path && matchAny(module, r.Deps, dep) {
					bad = append(bad, fmt.Sprintf("%s depends on %s (%s); rule for %s: %s", rel, relative(module, dep),
						strings.Join(chain(module, pkgs, path, dep), " -> "), r.Pkgs, r.Why))
				}
			}
			for _, u := range uses(p.files, r.Uses) {
				bad = append(bad, fmt.Sprintf("%s uses %s; rule for %s: %s", rel, u, r.Pkgs, r.Why))
			}
		}
		if !matched {
			bad = append(bad, fmt.Sprintf("rule for %s matches no package; move it with its package: %s", r.Pkgs, r.Why))
		}
	}
	return bad
}

// match reports whether import path matches pattern (see rule).
func match(module, pattern, path string) bool {
	switch {
	case pattern == "...":
		return true
	case pattern == ".":
		pattern = module
	case strings.HasPrefix(pattern, "./"):
		pattern = module + "/" + pattern[2:]
	}
	if base, ok := strings.CutSuffix(pattern, "/..."); ok {
		return path == base || strings.HasPrefix(path, base+"/")
	}
	return path == pattern
}

func matchAny(module string, patterns []string, path string) bool {
	return slices.ContainsFunc(patterns, func(p string) bool { return match(module, p, path) })
}

// relative writes a kolo import path the way the rules do.
func relative(module, path string) string {
	if path == module {
		return "."
	}
	if rest, ok := strings.CutPrefix(path, module+"/"); ok {
		return "./" + rest
	}
	return path
}

// chain is a shortest import chain from one package to another, so that a broken dependency rule
// says which import brought the dependency in.
func chain(module string, pkgs map[string]*pkg, from, to string) []string {
	prev := map[string]string{from: ""}
	queue := []string{from}
	for len(queue) > 0 {
		at := queue[0]
		queue = queue[1:]
		if at == to {
			var c []string
			for ; at != ""; at = prev[at] {
				c = append(c, relative(module, at))
			}
			slices.Reverse(c)
			return c
		}
		if p := pkgs[at]; p != nil {
			for _, imp := range p.Imports {
				if _, seen := prev[imp]; !seen {
					prev[imp] = at
					queue = append(queue, imp)
				}
			}
		}
	}
	return []string{relative(module, from), "...", relative(module, to)}
}

// uses returns where files name any of names ("importpath.Name", or "go" for a go statement), as
// "name at file:line".
func uses(files []*ast.File, names []string) []string {
	if len(names) == 0 {
		return nil
	}
	var found []string
	for _, f := range files {
		local := map[string]string{} // the name a file gives an import -> its path
		for _, spec := range f.Imports {
			path := strings.Trim(spec.Path.Value, `"`)
			name := path[strings.LastIndex(path, "/")+1:]
			if spec.Name != nil {
				name = spec.Name.Name
			}
			local[name] = path
		}
		ast.Inspect(f, func(n ast.Node) bool {
			var used string
			switch n := n.(type) {
			case *ast.GoStmt:
				used = "go"
			case *ast.SelectorExpr:
				if x, ok := n.X.(*ast.Ident); ok && x.Obj == nil && local[x.Name] != "" {
					used = local[x.Name] + "." + n.Sel.Name
				}
			}
			if used != "" && slices.Contains(names, used) {
				found = append(found, fmt.Sprintf("%s at %s", used, fset.Position(n.Pos())))
			}
			return true
		})
	}
	return found
}

var fset = token.NewFileSet()

// listPackages runs `go list -deps` over the module: its path, and every package the module's
// packages are built from (the standard library's too, for the import chains), by import path.
func listPackages(t *testing.T) (module string, pkgs map[string]*pkg) {
	t.Helper()
	root := filepath.Join("..", "..")
	goTool := "go"
	if _, err := exec.LookPath(goTool); err != nil { // the toolchain running this test, then
		goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	cmd := exec.Command(goTool, "list", "-m")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -m: %v", err)
	}
	module = strings.TrimSpace(string(out))
	cmd = exec.Command(goTool, "list", "-e", "-deps", "-json=ImportPath,Name,Dir,GoFiles,CgoFiles,Imports,Deps,Standard,DepOnly", "./...")
	cmd.Dir = root
	out, err = cmd.Output()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		t.Fatalf("go list -e -deps ./...: %v\n%s", err, exit.Stderr)
	} else if err != nil {
		t.Fatalf("go list -deps ./...: %v", err)
	}
	pkgs = map[string]*pkg{}
	for dec := json.NewDecoder(bytes.NewReader(out)); ; {
		p := new(pkg)
		if err := dec.Decode(p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("go list -deps ./...: decode: %v", err)
		}
		pkgs[p.ImportPath] = p
	}
	return module, pkgs
}

// parseFiles parses the files p is built from (its tests are not bound by its rules).
func parseFiles(t *testing.T, p *pkg) []*ast.File {
	t.Helper()
	var files []*ast.File
	for _, name := range slices.Concat(p.GoFiles, p.CgoFiles) {
		f, err := parser.ParseFile(fset, filepath.Join(p.Dir, name), nil, 0)
		if err != nil {
			t.Fatalf("%s: %v", p.ImportPath, err)
		}
		files = append(files, f)
	}
	return files
}

// Each kind of rule catches what it forbids, and only that: a direct import, a dependency through
// another package (named with its chain), a clock read and a goroutine, and a rule whose package
// is gone.
func TestRulesCatchViolations(t *testing.T) {
	const m = "example.com/m"
	src := func(code string) []*ast.File {
		f, err := parser.ParseFile(fset, "pure.go", "package pure\n"+code, 0)
		if err != nil {
			t.Fatal(err)
		}
		return []*ast.File{f}
	}
	pkgs := func(pure *pkg) map[string]*pkg {
		pure.ImportPath = m + "/pure"
		return map[string]*pkg{
			pure.ImportPath: pure,
			m + "/via":      {ImportPath: m + "/via", Imports: []string{"net"}, Deps: []string{"net"}},
			"net":           {ImportPath: "net", Standard: true},
			"time":          {ImportPath: "time", Standard: true},
		}
	}
	r := []rule{{Pkgs: "./pure/...", Why: "it is pure", Imports: []string{"log"}, Deps: []string{"net"}, Uses: pure}}
	for _, tc := range []struct {
		name  string
		pure  *pkg
		rules []rule
		want  []string // substrings of the violations, one each, in order
	}{
		{"clean", &pkg{Imports: []string{"time"}, Deps: []string{"time"},
			files: src("import \"time\"\nfunc f(now time.Time) time.Duration { var time struct{ Now int }; _ = time.Now; return 0 }")}, r, nil},
		{"direct import", &pkg{Imports: []string{"log"}, Deps: []string{"log"}}, r,
			[]string{"./pure imports log; rule for ./pure/...: it is pure"}},
		{"dependency through another package", &pkg{Imports: []string{m + "/via"}, Deps: []string{m + "/via", "net"}}, r,
			[]string{"./pure depends on net (./pure -> ./via -> net); rule for ./pure/...: it is pure"}},
		{"clock and goroutine", &pkg{Imports: []string{"time"}, Deps: []string{"time"},
			files: src("import clock \"time\"\nfunc f() { go f(); _ = clock.Now() }")}, r,
			[]string{"./pure uses go at pure.go:3", "./pure uses time.Now at pure.go:3"}},
		{"rule without a package", &pkg{}, []rule{{Pkgs: "./gone", Why: "it is gone"}},
			[]string{"rule for ./gone matches no package; move it with its package: it is gone"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := check(m, tc.rules, pkgs(tc.pure))
			if len(got) != len(tc.want) {
				t.Fatalf("violations %q, want %d like %q", got, len(tc.want), tc.want)
			}
			for i, w := range tc.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("violation %q, want it to say %q", got[i], w)
				}
			}
		})
	}
}

// TestFoldersFormLayers checks that kolo's folders (each top-level folder, each folder directly
// under internal/, and the root package) can be stacked in layers, each importing only folders below it: no folder imports one that imports it
// back, directly or through others. Go forbids cycles between packages but not between folders,
// and a folder that held both a helper the transport imports and a harness that imports the
// launcher would make the tree lie about which parts build on which.
func TestFoldersFormLayers(t *testing.T) {
	module, all := listPackages(t)
	for _, c := range folderCycles(module, all) {
		t.Error(c)
	}
}

// folder is the folder a kolo package belongs to: its top-level folder, or under internal/ the
// one below it ("internal/launch"); "." for the root package.
func folder(module, path string) string {
	rest, ok := strings.CutPrefix(path, module+"/")
	if !ok {
		return "."
	}
	parts := strings.SplitN(rest, "/", 3)
	if parts[0] == "internal" && len(parts) > 1 {
		return parts[0] + "/" + parts[1]
	}
	return parts[0]
}

// folderCycles returns, for each set of folders that import each other around a loop, the loop's
// folders and the package imports that tie them.
func folderCycles(module string, pkgs map[string]*pkg) []string {
	ties := map[[2]string][]string{} // folder pair -> "pkg -> pkg" imports between them
	edges := map[string][]string{}
	for _, path := range slices.Sorted(maps.Keys(pkgs)) {
		p := pkgs[path]
		if p.Standard || p.DepOnly || !match(module, "./...", path) {
			continue
		}
		from := folder(module, path)
		for _, imp := range p.Imports {
			if !match(module, "./...", imp) {
				continue
			}
			to := folder(module, imp)
			if to == from {
				continue
			}
			k := [2]string{from, to}
			if ties[k] == nil {
				edges[from] = append(edges[from], to)
			}
			ties[k] = append(ties[k], relative(module, path)+" -> "+relative(module, imp))
		}
	}
	var bad []string
	for _, scc := range components(edges) {
		if len(scc) < 2 {
			continue
		}
		slices.Sort(scc)
		var why []string
		for _, a := range scc {
			for _, b := range scc {
				why = append(why, ties[[2]string{a, b}]...)
			}
		}
		bad = append(bad, fmt.Sprintf("folders %s import each other around a loop (%s): move the package that runs back up, or split its folder",
			strings.Join(scc, ", "), strings.Join(why, "; ")))
	}
	return bad
}

// components is Tarjan's strongly connected components of a graph.
func components(edges map[string][]string) [][]string {
	index, low, on := map[string]int{}, map[string]int{}, map[string]bool{}
	var stack []string
	var out [][]string
	var visit func(v string)
	visit = func(v string) {
		index[v], low[v] = len(index), len(index)
		stack = append(stack, v)
		on[v] = true
		for _, w := range edges[v] {
			if _, seen := index[w]; !seen {
				visit(w)
				low[v] = min(low[v], low[w])
			} else if on[w] {
				low[v] = min(low[v], index[w])
			}
		}
		if low[v] == index[v] {
			var c []string
			for {
				w := stack[len(stack)-1]
				stack = stack[:len(stack)-1]
				on[w] = false
				c = append(c, w)
				if w == v {
					break
				}
			}
			out = append(out, c)
		}
	}
	for _, v := range slices.Sorted(maps.Keys(edges)) {
		if _, seen := index[v]; !seen {
			visit(v)
		}
	}
	return out
}

// A loop between folders is found and named with the imports that make it, and packages that
// import each other's folders in one direction only pass.
func TestFolderCyclesFound(t *testing.T) {
	const m = "example.com/m"
	pkgs := func(imports map[string][]string) map[string]*pkg {
		out := map[string]*pkg{}
		for path, imps := range imports {
			out[m+path] = &pkg{ImportPath: m + path}
			for _, imp := range imps {
				out[m+path].Imports = append(out[m+path].Imports, m+imp)
			}
		}
		return out
	}
	for _, tc := range []struct {
		name    string
		imports map[string][]string // "/pkg" -> "/pkg" imports
		want    []string
	}{
		{"layers", map[string][]string{"": {"/engine", "/transport"}, "/engine": {"/transport/tcp"}, "/transport/tcp": {"/transport"}, "/transport": nil}, nil},
		{"harness beside helpers", map[string][]string{
			"/harness/e2e": {"/launch"}, "/launch": {"/harness/netif"}, "/harness/netif": nil},
			[]string{"folders harness, launch import each other around a loop (./harness/e2e -> ./launch; ./launch -> ./harness/netif)"}},
		{"folders under internal", map[string][]string{
			"/internal/launch/proc": {"/internal/netif"}, "/internal/launch": {"/internal/launch/proc"}, "/internal/netif": nil}, nil},
		{"loop under internal", map[string][]string{
			"/internal/a/x": {"/internal/b"}, "/internal/b": {"/internal/a/y"}, "/internal/a/y": nil},
			[]string{"folders internal/a, internal/b import each other around a loop (./internal/a/x -> ./internal/b; ./internal/b -> ./internal/a/y)"}},
		{"through a third folder", map[string][]string{"/a/x": {"/b"}, "/b": {"/c"}, "/c": {"/a/y"}, "/a/y": nil},
			[]string{"folders a, b, c import each other around a loop (./a/x -> ./b; ./b -> ./c; ./c -> ./a/y)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := folderCycles(m, pkgs(tc.imports))
			if len(got) != len(tc.want) {
				t.Fatalf("loops %q, want %d like %q", got, len(tc.want), tc.want)
			}
			for i, w := range tc.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("loop %q, want it to say %q", got[i], w)
				}
			}
		})
	}
}

// public lists the kolo packages a program outside the module may import: the Go API docs/ and the
// README present. Everything else that ships sits under internal/, where Go refuses it to other
// modules; main packages (commands, the C library, examples) and test-only packages import nothing
// anyone could import in turn.
var public = []string{"."}

// TestOnlyTheAPIIsPublic fails when a package that ships outside internal/ is not in public:
// move it under internal/, or document it and add it.
func TestOnlyTheAPIIsPublic(t *testing.T) {
	module, all := listPackages(t)
	for _, bad := range exposed(module, all) {
		t.Error(bad)
	}
}

// exposed names the packages other modules can import that public does not list.
func exposed(module string, pkgs map[string]*pkg) []string {
	var bad []string
	for _, path := range slices.Sorted(maps.Keys(pkgs)) {
		p := pkgs[path]
		rel := relative(module, path)
		switch {
		case p.Standard || p.DepOnly || !match(module, "./...", path):
		case p.Name == "main" || len(p.GoFiles)+len(p.CgoFiles) == 0: // a command, or tests only
		case match(module, "./internal/...", path) || match(module, "./testbed/...", path):
		case !slices.Contains(public, rel):
			bad = append(bad, fmt.Sprintf("%s can be imported by other modules but is not kolo's documented API: move it under internal/", rel))
		}
	}
	return bad
}

// A shipped library package outside internal/ is caught; the API, commands, test-only packages and
// what is under internal/ and testbed/ are not.
func TestExposedFound(t *testing.T) {
	const m = "example.com/m"
	pkgs := map[string]*pkg{}
	for _, p := range []pkg{
		{ImportPath: m, Name: "m", GoFiles: []string{"m.go"}},
		{ImportPath: m + "/cmd/tool", Name: "main", GoFiles: []string{"main.go"}},
		{ImportPath: m + "/deploy/slurm", Name: "slurm"},
		{ImportPath: m + "/internal/engine", Name: "engine", GoFiles: []string{"engine.go"}},
		{ImportPath: m + "/testbed/e2e", Name: "e2e", GoFiles: []string{"e2e.go"}},
		{ImportPath: m + "/engine", Name: "engine", GoFiles: []string{"engine.go"}},
	} {
		pkgs[p.ImportPath] = &p
	}
	got := exposed(m, pkgs)
	if len(got) != 1 || !strings.Contains(got[0], "./engine can be imported") {
		t.Errorf("exposed = %q, want only ./engine", got)
	}
}
