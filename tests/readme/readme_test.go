// Package readme runs the commands of README.md and docs/*.md as a reader
// would, so that a command that stopped working, or a figure the page
// quotes that the program no longer prints, fails the tests.
//
// Every ```sh block is a bash script (set -euo pipefail) run in a copy of
// the working tree, after `make build`, with bin/ on PATH; the blocks of
// a page run in order in the same folder, so one block may use what an
// earlier one wrote (a dump, a checkpoint). `go run ./cmd/gcompile` runs
// the bin/gcompile just built, the same program without a link per call.
// A block that opens with "$ " is a command and the output it prints: the
// command runs and its standard output must equal the rest of the block.
// Other blocks (Go code, dump excerpts) are not commands.
//
// HTML comments right above a block (invisible on the rendered page) say
// how the test runs it, one directive a line:
//
//	<!-- test: replace "--steps 1000" "--steps 4" -->  small step counts; Go-quoted strings
//	<!-- test: expect "step 1/3 loss 5\.508" -->      a regexp the output (stdout and stderr) must match
//	<!-- test: expect-full "train 2\.6\d at step 250" -->  under GCOMPILE_FULL_TESTS=1 the block runs as
//	                                                   shown, without the replaces, and must match this instead
//	<!-- test: skip needs a GPU machine -->            not run, with the reason (listed as a skipped test)
//	<!-- test: full -->                                run only with GCOMPILE_FULL_TESTS=1 (make test-full)
//	<!-- test: needs torchrun mpirun -->               skipped, saying why, when one is not on PATH; a
//	                                                   failure under GCOMPILE_REQUIRE_LAUNCHERS=1 (CI)
package readme

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// block is one fenced code block of a page with the directives above it.
type block struct {
	file     string
	line     int // of the opening fence
	lang     string
	text     string
	replaces [][2]string
	expects  []string
	// fullExpects are checked instead of expects under GCOMPILE_FULL_TESTS,
	// where the block runs as the page shows it, without the replaces.
	fullExpects []string
	skip        string
	full        bool
	needs       []string // commands that must be on PATH
}

var directive = regexp.MustCompile(`^<!--\s*test:\s*([\w-]+)\s*(.*?)\s*-->$`)

// parse reads the fenced blocks of a Markdown page and their directives;
// a directive that does not parse is an error naming its line.
func parse(path string) ([]block, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var (
		out     []block
		pending block
		cur     *block
		body    []string
		n       int
	)
	name := filepath.Base(path)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		n++
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		if cur != nil {
			if trimmed == "```" {
				cur.text = strings.Join(body, "\n") + "\n"
				out = append(out, *cur)
				cur, body, pending = nil, nil, block{}
				continue
			}
			body = append(body, line)
			continue
		}
		if strings.HasPrefix(trimmed, "```") {
			b := pending
			b.file, b.line, b.lang = name, n, strings.TrimPrefix(trimmed, "```")
			cur = &b
			continue
		}
		m := directive.FindStringSubmatch(trimmed)
		if m == nil {
			if trimmed != "" {
				pending = block{} // directives belong to the block right below them
			}
			continue
		}
		if err := pending.add(m[1], m[2]); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", name, n, err)
		}
	}
	if cur != nil {
		return nil, fmt.Errorf("%s:%d: the block opened here is never closed", name, cur.line)
	}
	return out, sc.Err()
}

func (b *block) add(kind, arg string) error {
	switch kind {
	case "replace":
		var from, to string
		if _, err := fmt.Sscanf(arg, "%q %q", &from, &to); err != nil {
			return fmt.Errorf(`replace wants two Go-quoted strings ("old" "new"), got %s: %w`, arg, err)
		}
		b.replaces = append(b.replaces, [2]string{from, to})
	case "expect", "expect-full":
		var re string
		if _, err := fmt.Sscanf(arg, "%q", &re); err != nil {
			return fmt.Errorf(`%s wants one Go-quoted regexp, got %s: %w`, kind, arg, err)
		}
		if _, err := regexp.Compile(re); err != nil {
			return fmt.Errorf("%s: %w", kind, err)
		}
		if kind == "expect" {
			b.expects = append(b.expects, re)
		} else {
			b.fullExpects = append(b.fullExpects, re)
		}
	case "skip":
		if arg == "" {
			return fmt.Errorf("skip needs a reason")
		}
		b.skip = arg
	case "full":
		b.full = true
	case "needs":
		b.needs = strings.Fields(arg)
		if len(b.needs) == 0 {
			return fmt.Errorf("needs names the commands the block runs")
		}
	default:
		return fmt.Errorf("unknown directive %q (replace, expect, expect-full, skip, full, needs)", kind)
	}
	return nil
}

// command says whether b is run, and splits a "$ " block into its command
// and the output it shows.
func (b *block) command() (script, want string, ok bool) {
	if strings.HasPrefix(b.text, "$ ") {
		cmd, rest, _ := strings.Cut(strings.TrimPrefix(b.text, "$ "), "\n")
		return cmd + "\n", rest, true
	}
	if b.lang == "sh" || b.lang == "bash" {
		return b.text, "", true
	}
	return "", "", false
}

func (b *block) String() string { return fmt.Sprintf("%s:%d", b.file, b.line) }

func TestParseDirectives(t *testing.T) {
	page := "# t\n\n<!-- test: replace \"--steps 200\" \"--steps 3\" -->\n<!-- test: expect \"loss \\\\d\" -->\n```sh\nrun --steps 200\n```\n\n" +
		"<!-- test: skip needs a GPU -->\n\ntext between\n```sh\nnot skipped\n```\n\n```go\nx := 1\n```\n\n```\n$ echo hi\nhi\n```\n"
	path := filepath.Join(t.TempDir(), "PAGE.md")
	require.NoError(t, os.WriteFile(path, []byte(page), 0o644))
	bs, err := parse(path)
	require.NoError(t, err)
	require.Len(t, bs, 4)
	require.Equal(t, [][2]string{{"--steps 200", "--steps 3"}}, bs[0].replaces)
	require.Equal(t, []string{`loss \d`}, bs[0].expects)
	require.Equal(t, "PAGE.md:5", bs[0].String())
	require.Empty(t, bs[1].skip, "a directive is the next block's only")
	_, _, ok := bs[2].command()
	require.False(t, ok, "Go code is no command")
	script, want, ok := bs[3].command()
	require.True(t, ok)
	require.Equal(t, "echo hi\n", script)
	require.Equal(t, "hi\n", want)

	for _, bad := range []string{"<!-- test: replace \"a\" -->\n```sh\nx\n```\n", "<!-- test: frob -->\n```sh\nx\n```\n", "```sh\nx\n"} {
		require.NoError(t, os.WriteFile(path, []byte(bad), 0o644))
		_, err := parse(path)
		require.Error(t, err, "%q", bad)
		require.Contains(t, err.Error(), "PAGE.md:")
	}
}

// TestREADMECommands runs every command block of README.md and docs/*.md.
func TestREADMECommands(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the README's commands; skipped with -short")
	}
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	pages, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	require.NoError(t, err)
	pages = append([]string{filepath.Join(root, "README.md")}, pages...)
	var all [][]block
	for _, p := range pages {
		bs, err := parse(p)
		require.NoError(t, err)
		all = append(all, bs)
	}
	work := copyTree(t, root)
	// The pages' commands run as a user types them: without this
	// harness's GCOMPILE_FULL_TESTS, so the README's own `make test` (run
	// whole under make test-full) is the plain target, not the full
	// matrices with this test inside it again.
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GCOMPILE_FULL_TESTS=") {
			env = append(env, kv)
		}
	}
	env = append(env, "PATH="+filepath.Join(work, "bin")+string(os.PathListSeparator)+os.Getenv("PATH"))
	if os.Geteuid() == 0 {
		// What --allow-run-as-root says, for README's mpirun lines.
		env = append(env, "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
	}
	out, err := runSplit(t, work, env, "make build\n", false, 5*time.Minute)
	require.NoError(t, err, "make build: %s", out)
	full := os.Getenv("GCOMPILE_FULL_TESTS") != ""
	for _, bs := range all {
		for _, b := range bs {
			script, want, ok := b.command()
			if !ok {
				continue
			}
			t.Run(b.String(), func(t *testing.T) {
				switch {
				case b.skip != "":
					t.Skip(b.skip)
				case b.full && !full:
					t.Skip("long: runs in make test-full (GCOMPILE_FULL_TESTS=1)")
				}
				for _, c := range b.needs {
					if _, err := exec.LookPath(c); err != nil {
						if os.Getenv("GCOMPILE_REQUIRE_LAUNCHERS") != "" {
							t.Fatalf("%s needs %s, which is not on PATH (GCOMPILE_REQUIRE_LAUNCHERS is set)", b.String(), c)
						}
						t.Skipf("needs %s, which is not on PATH (.ci/run installs it)", c)
					}
				}
				script = strings.ReplaceAll(script, "go run ./cmd/gcompile", "gcompile")
				replaces, expects := b.replaces, b.expects
				if full && len(b.fullExpects) > 0 {
					replaces, expects = nil, b.fullExpects
				}
				for _, r := range replaces {
					if !strings.Contains(script, r[0]) {
						t.Fatalf("%s: replace %q: the block no longer contains it", b.String(), r[0])
					}
					script = strings.ReplaceAll(script, r[0], r[1])
				}
				limit := 10 * time.Minute
				if full {
					// make test-full runs the README's make demo and make
					// test whole, beside the rest of the full suite.
					limit = 30 * time.Minute
				}
				stdout, err := runSplit(t, work, env, script, want != "", limit)
				if err != nil {
					t.Fatalf("%s failed: %v\nscript:\n%s\noutput:\n%s", b.String(), err, script, tail(stdout, 6000))
				}
				for _, re := range expects {
					if !regexp.MustCompile(re).MatchString(stdout) {
						t.Errorf("%s: the output no longer matches %q (the figure the page quotes)\noutput:\n%s", b.String(), re, tail(stdout, 4000))
					}
				}
				if want != "" && trimLines(stdout) != trimLines(want) {
					t.Errorf("%s: the command prints other output than the page shows\npage:\n%s\nprinted:\n%s", b.String(), want, stdout)
				}
			})
		}
	}
}

// copyTree copies the working tree's files (tracked, and untracked ones
// git does not ignore) to a fresh folder, so the commands write their
// outputs there and run on exactly what a commit would hold. The copy is
// a repository with those files committed, as a fresh clone is: make
// test's gofmt check lists the files with git, and bench/gpu's bundle
// records the commit.
func copyTree(t *testing.T, root string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "gcompile")
	cmd := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	cmd.Dir = root
	list, err := cmd.Output()
	require.NoError(t, err, "git ls-files")
	for _, rel := range strings.Split(strings.TrimRight(string(list), "\x00"), "\x00") {
		src := filepath.Join(root, rel)
		info, err := os.Lstat(src)
		if os.IsNotExist(err) {
			continue // deleted in the working tree
		}
		require.NoError(t, err)
		if !info.Mode().IsRegular() {
			continue
		}
		to := filepath.Join(dst, rel)
		require.NoError(t, os.MkdirAll(filepath.Dir(to), 0o755))
		in, err := os.Open(src)
		require.NoError(t, err)
		o, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, info.Mode().Perm())
		require.NoError(t, err)
		_, err = io.Copy(o, in)
		in.Close()
		require.NoError(t, err)
		require.NoError(t, o.Close())
	}
	for _, args := range [][]string{
		{"init", "-q"},
		{"add", "-A"},
		{"-c", "user.name=readme", "-c", "user.email=readme@localhost", "-c", "commit.gpgsign=false", "commit", "-q", "-m", "the working tree"},
	} {
		cmd := exec.Command("git", args...)
		cmd.Dir = dst
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "git %s: %s", strings.Join(args, " "), out)
	}
	return dst
}

// runSplit runs script with bash in dir; it returns stdout and stderr
// together, or stdout alone when stdoutOnly is set (stderr then goes to
// the test log on failure only).
func runSplit(t *testing.T, dir string, env []string, script string, stdoutOnly bool, timeout time.Duration) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", script)
	cmd.Dir, cmd.Env = dir, env
	// At the limit the whole block goes, not bash alone: a make test the
	// block started would otherwise run on, orphaned, beside the tests
	// that follow.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	var out, errOut bytes.Buffer
	cmd.Stdout = &out
	if stdoutOnly {
		cmd.Stderr = &errOut
	} else {
		cmd.Stderr = &out
	}
	start := time.Now()
	err := cmd.Run()
	t.Logf("ran in %v", time.Since(start).Round(time.Millisecond))
	if err != nil && stdoutOnly {
		return out.String() + errOut.String(), err
	}
	return out.String(), err
}

func trimLines(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i, l := range lines {
		lines[i] = strings.TrimRight(l, " \t")
	}
	return strings.Join(lines, "\n")
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}

// At its time limit a block is killed whole: what it started in the
// background does not run on beside the tests that follow.
func TestRunSplitKillsTheWholeBlock(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	_, err := runSplit(t, t.TempDir(), os.Environ(), "sleep 300 & echo $! > "+pidFile+"; wait", false, time.Second)
	require.Error(t, err)
	data, err := os.ReadFile(pidFile)
	require.NoError(t, err)
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	require.NoError(t, err)
	gone := func() bool {
		if syscall.Kill(pid, 0) != nil {
			return true
		}
		// Killed but not yet reaped by whoever adopted it.
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		return err != nil || strings.Contains(string(stat), ") Z ")
	}
	require.Eventually(t, gone, 5*time.Second, 50*time.Millisecond, "the block's background sleep (pid %d) outlived it", pid)
}
