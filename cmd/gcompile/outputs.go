package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"gcompile/data"
	"gcompile/data/tokenizer"
	"gcompile/internal/filekind"
	"gcompile/internal/linkpath"
	"gcompile/runtime"
	"gcompile/runtime/checkpoint"
)

// checkPaths runs before any compile or training: every output the run
// is asked for must be writable, every input file must exist and the
// training text must be text, so that none of it is found out after the
// work is done (a metrics file that cannot be written after hours of
// training loses them). Outputs are checked by
// the process that writes them, process 0 (lead); inputs by every process,
// each of which reads them. --checkpoint-dir and --resume are
// checkCheckpointPaths'.
func checkPaths(c *config, lead bool) error {
	var errs []error
	if c.load != "" {
		if err := checkInputFile("load", c.load); err != nil {
			errs = append(errs, err)
		}
	}
	switch {
	case isTokenData(c.data):
		// Opened and checked now (or before planning), kept for training
		// (loadSource); without --run too, since the data's vocabulary
		// sizes the model that is compiled.
		if err := c.openTokenData(); err != nil {
			errs = append(errs, err)
		}
	case c.run && c.corpus == nil:
		// What --data is comes first: a path that is not there, or a
		// folder of datasets, is no text for the flags below to be
		// refused against.
		if _, err := os.Stat(c.data); c.data != "" && err != nil {
			if _, ierr := os.Stat(c.data + ".idx"); ierr != nil && !errors.Is(ierr, fs.ErrNotExist) {
				// The index is there but cannot be read (a link loop, a
				// folder without access): its error, not "no such".
				errs = append(errs, fmt.Errorf("--data %s: the dataset's index: %w", c.data, ierr))
				break
			}
			errs = append(errs, fmt.Errorf("--data %s: no such text file or folder, and no dataset %s.bin and %s.idx: %w", c.data, c.data, c.data, err))
			break
		}
		if ds := datasetsIn(c.data); len(ds) > 0 {
			errs = append(errs, fmt.Errorf("--data %s is a folder of token datasets (%s), not of text: name one, --data %s, or a blend of them",
				c.data, strings.Join(ds, ", "), filepath.Join(c.data, ds[0])))
			break
		}
		for _, f := range []string{"split", "data-cache-dir", "make-vocab-size-divisible-by", "merges"} {
			if c.explicit[f] {
				errs = append(errs, fmt.Errorf("--%s applies to a token dataset (--data PREFIX, from gcompile data prepare); %s is text", f, textData(c.data)))
			}
		}
		if c.tokenizer != "" && strings.HasSuffix(c.data, ".bin") {
			// data prepare skips binary files: not the way to a dataset.
			errs = append(errs, fmt.Errorf("--data %s: no %s beside it: a token dataset is PREFIX.bin and PREFIX.idx, as gcompile data prepare or Megatron-LM's tools/preprocess_data.py write them", c.data, strings.TrimSuffix(c.data, ".bin")+".idx"))
			break
		}
		if c.tokenizer != "" {
			errs = append(errs, fmt.Errorf("--tokenizer %s: %s is text, which trains one byte per token; tokenize it first with gcompile data prepare --tokenizer %s --output-prefix PREFIX %s, then train on --data PREFIX",
				c.tokenizer, textData(c.data), c.tokenizer, orDefault(c.data)))
			break
		}
		// Read now, kept for training (loadSource), not read twice.
		corpus, err := data.Load(data.Options{Path: c.data, MaxBytes: int64(c.maxDataMB) << 20})
		if err != nil {
			errs = append(errs, dataErr(c, err))
		}
		c.corpus = corpus
	}
	if c.evalOnly && c.evalBatches == 0 && !isTokenData(c.data) {
		// Said before the compile, not when the evaluation starts.
		errs = append(errs, fmt.Errorf("eval: --eval-batches 0 (the whole held-out split) needs a token dataset (--data PREFIX); %s is text, evaluated on windows at every offset: give a number of batches", textData(c.data)))
	}
	if lead {
		errs = append(errs, checkOutputs(c))
	}
	if w, err := worldOf(c); c.logDir != "" && (c.launchProcs > 1 || err != nil || w.Size > 1) {
		// The other ranks write their logs there: a folder that cannot
		// be made stopped each of them after the job had started. One
		// process writes none there (a note says so), and makes none.
		errs = append(errs, checkOutputDir("log-dir", c.logDir))
	}
	return errors.Join(errs...)
}

// orDefault is --data as a command line argument: the default corpus's
// folder when it was not given.
func orDefault(path string) string {
	if path != "" {
		return path
	}
	if p, err := data.DefaultPath(); err == nil {
		return p
	}
	return "TEXT"
}

// textData names the text a run trains on: --data PATH, or the default
// data when none was given.
func textData(path string) string {
	if path != "" {
		return "--data " + strconv.Quote(path)
	}
	return "the default data (no --data: the Go sources, " + orDefault("") + ")"
}

// outputPath is a file the run writes at its end, or reads, by its flag;
// for an input folder, folder says which of its files are read.
type outputPath struct {
	flag, path string
	folder     func(path string) bool
}

// outputPaths are the run's file outputs that were asked for.
func (c *config) outputPaths() []outputPath {
	var out []outputPath
	for _, o := range []outputPath{{"metrics", c.metrics, nil}, {"trace", c.trace, nil}, {"save", c.save, nil}, {"timeline", c.timeline, nil}, {"report", c.report, nil},
		{"plan-trace", c.planTrace, nil}, {"save-hardware", c.saveHardware, nil}} {
		if o.path != "" {
			out = append(out, o)
		}
	}
	return out
}

// inputPaths are the files the run reads that an output could be
// mistaken for; the model file's flag is "".
func (c *config) inputPaths() []outputPath {
	var in []outputPath
	hw, _, _ := strings.Cut(c.hardware, ":")
	if !strings.HasSuffix(strings.ToLower(hw), ".json") {
		hw = ""
	}
	for _, o := range []outputPath{{"", c.Model, nil}, {"calibrate", c.calibrate, nil}, {"refine-trace", c.refineTrace, nil}, {"hardware", hw, nil},
		{"tokenizer", c.tokenizer, nil}, {"merges", c.merges, nil}, {"data", c.data, nil}} {
		if o.path != "" {
			in = append(in, o)
		}
	}
	// A shard index's shards are read with it.
	if c.load != "" {
		for _, f := range checkpoint.IndexedFiles(c.load) {
			in = append(in, outputPath{flag: "load", path: f})
		}
	}
	// A token dataset is named by its prefix (or PREFIX.bin, PREFIX.idx),
	// a blend by several: their files are PREFIX.bin, .idx and
	// gcompile's .json beside them.
	if isTokenData(c.data) {
		if parts, err := dataBlend(c.data); err == nil {
			for _, p := range parts {
				for _, ext := range []string{".bin", ".idx", ".json"} {
					in = append(in, outputPath{flag: "data", path: datasetPrefix(p.Prefix) + ext})
				}
			}
		}
	}
	// The files of an input folder that are read: a text corpus's, when
	// it trains (data.Reads: the loader's own choice), and a tokenizer
	// folder's tokenizer files.
	if fi, err := os.Stat(c.data); c.run && c.data != "" && err == nil && fi.IsDir() {
		dir := c.data
		in = append(in, outputPath{flag: "data", path: dir, folder: func(p string) bool { return data.Reads(dir, p) }})
	}
	if c.tokenizer != "" {
		reads := tokenizer.ReadPaths(c.tokenizer, c.merges)
		in = append(in, outputPath{flag: "tokenizer", path: c.tokenizer, folder: func(p string) bool {
			return slices.ContainsFunc(reads, func(r string) bool { return samePath(p, r) })
		}})
	}
	return in
}

// reads says whether the run reads the file at path as input in: the
// same file, or one of an input folder's files it reads.
func (in outputPath) reads(path string) bool {
	if in.folder != nil {
		return in.folder(path)
	}
	return samePath(in.path, path)
}

// isStepFolder says whether dir is one checkpoint's folder (step-NNNNNNNN,
// or any folder holding a manifest), not the folder of a run's steps.
func isStepFolder(dir string) bool {
	if _, err := os.Stat(filepath.Join(dir, checkpoint.ManifestName)); err == nil {
		return true
	}
	_, ok := checkpoint.StepOf(filepath.Base(filepath.Clean(dir)))
	return ok
}

// maxOutputName is the longest output file name whose temporary file
// (see checkOutputFile) fits a 255-byte name.
const maxOutputName = 255 - runtime.TempNameOverhead

// realPath is path made absolute with the links of its deepest existing
// folder resolved (the rest need not exist yet): a folder reached through
// a link is the folder it names, and a link is where it leads, as an
// output is written (linkpath.Target), for outputs that must not land
// inside another's files.
func realPath(path string) string {
	p, err := filepath.Abs(linkpath.Target(path))
	if err != nil {
		return path
	}
	rest := ""
	for d := p; ; d = filepath.Dir(d) {
		if r, err := filepath.EvalSymlinks(d); err == nil {
			return filepath.Join(r, rest)
		}
		if filepath.Dir(d) == d {
			return p
		}
		rest = filepath.Join(filepath.Base(d), rest)
	}
}

// within says whether path lies inside folder dir (at any depth), links
// resolved.
func within(dir, path string) bool {
	d, p := realPath(dir), realPath(path)
	rel, err := filepath.Rel(d, p)
	return err == nil && rel != "." && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}

// samePath says whether a and b name one file: the same absolute path, or
// one existing file under two names (a link).
func samePath(a, b string) bool {
	aa, err1 := filepath.Abs(a)
	ab, err2 := filepath.Abs(b)
	if err1 == nil && err2 == nil && aa == ab {
		return true
	}
	fa, err1 := os.Stat(a)
	fb, err2 := os.Stat(b)
	return err1 == nil && err2 == nil && os.SameFile(fa, fb)
}

// checkOutputs checks each output path, and that no two outputs would
// write the same file (one would silently replace the other).
func checkOutputs(c *config) error {
	var errs []error
	seen := map[string]string{}
	inputs := c.inputPaths()
	for _, o := range c.outputPaths() {
		if err := checkOutputFile(o.flag, o.path); err != nil {
			errs = append(errs, err)
			continue
		}
		// The file's folder with its links resolved, and its name: one
		// file reached through a linked folder is the same file.
		key := filepath.Join(realPath(filepath.Dir(o.path)), filepath.Base(o.path))
		if other, ok := seen[key]; ok {
			errs = append(errs, fmt.Errorf("--%s and --%s both write %s; give each its own file", other, o.flag, o.path))
			continue
		}
		seen[key] = o.flag
		for _, in := range inputs {
			if in.reads(o.path) {
				what := "--" + in.flag + "'s input"
				if in.flag == "" {
					what = "the model file"
				}
				errs = append(errs, fmt.Errorf("--%s %s is also %s: writing it would destroy what was read; give the output another file", o.flag, o.path, what))
			}
		}
		inside := false
		for _, d := range []outputPath{{"checkpoint-dir", c.ckptDir, nil}, {"resume", c.resume, nil}, {"dump", c.dump, nil}, {"log-dir", c.logDir, nil}} {
			if d.path != "" && samePath(d.path, o.path) && d.flag != "resume" {
				// A file where the run makes its folder: found before the
				// run, not when the file could not be written after it.
				errs = append(errs, fmt.Errorf("--%s %s is also --%s's folder; give each its own path", o.flag, o.path, d.flag))
				inside = true
				continue
			}
			if d.path != "" && within(d.path, o.path) {
				what := "a checkpoint's files"
				switch d.flag {
				case "dump":
					what = "the dump's files, which every run replaces"
				case "log-dir":
					what = "or beside the processes' logs (rank-N.log)"
				}
				errs = append(errs, fmt.Errorf("--%s %s is inside --%s %s: it would write over %s; give it a path outside", o.flag, o.path, d.flag, d.path, what))
				inside = true
			}
		}
		// Another run's checkpoint, which this run does not name.
		if ck := enclosingCheckpoint(filepath.Dir(realPath(o.path))); ck != "" && !inside {
			errs = append(errs, fmt.Errorf("--%s %s is inside checkpoint %s: it would write over or beside that checkpoint's files; give it a path outside", o.flag, o.path, ck))
		}
	}
	// A folder of outputs among the checkpoints mixes its files with the
	// steps': a dump named like the last step's folder took it, and the
	// run lost its checkpoint; checkpoints written inside the step they
	// resumed from were pruned with it.
	for _, d := range []outputPath{{"checkpoint-dir", c.ckptDir, nil}, {"resume", c.resume, nil}} {
		if d.path != "" && c.dump != "" && (within(d.path, c.dump) || samePath(d.path, c.dump)) {
			errs = append(errs, fmt.Errorf("--dump %s is inside --%s %s: its files would mix with the checkpoints' (a dump named like a step's folder takes it); dump into a folder outside", c.dump, d.flag, d.path))
		}
	}
	// The processes' logs are a folder of their own, as --dump is: among
	// checkpoints or a dump they mix with files another part owns, and a
	// log folder that is another output's path fails every rank.
	if c.logDir != "" {
		for _, d := range []outputPath{{"checkpoint-dir", c.ckptDir, nil}, {"resume", c.resume, nil}, {"dump", c.dump, nil}} {
			switch {
			case d.path == "":
			case samePath(d.path, c.logDir):
				errs = append(errs, fmt.Errorf("--log-dir %s is also --%s's folder: the logs would mix with its files; give each its own folder", c.logDir, d.flag))
			case within(d.path, c.logDir):
				errs = append(errs, fmt.Errorf("--log-dir %s is inside --%s %s: the logs would mix with its files; give the logs a folder outside", c.logDir, d.flag, d.path))
			}
			if d.path != "" && d.flag != "resume" && within(c.logDir, d.path) {
				errs = append(errs, fmt.Errorf("--%s %s is inside --log-dir %s: give it a folder outside the logs'", d.flag, d.path, c.logDir))
			}
		}
	}
	if c.ckptDir != "" && c.resume != "" && (within(c.resume, c.ckptDir) || samePath(c.resume, c.ckptDir) && isStepFolder(c.resume)) {
		errs = append(errs, fmt.Errorf("--checkpoint-dir %s is inside the checkpoint --resume %s: new checkpoints would nest in it and go when it is pruned; give the folder that holds the steps (its parent), or another folder", c.ckptDir, c.resume))
	} else if c.ckptDir != "" {
		if ck := enclosingCheckpoint(c.ckptDir); ck != "" {
			errs = append(errs, fmt.Errorf("--checkpoint-dir %s is inside checkpoint %s: this run's steps would be saved into another's checkpoint; give it a folder of its own (the folder that holds the step-NNNNNNNN folders is a run's)", c.ckptDir, ck))
		}
	}
	errs = append(errs, outputsInTextData(c)...)
	if c.dataCacheDir != "" {
		// Checked now, not after the compile: a file there, or a folder
		// that cannot be made. One that exists is taken as it is, read
		// only if it must be (its indexes built by another user).
		if fi, err := os.Stat(c.dataCacheDir); err == nil && !fi.IsDir() {
			errs = append(errs, fmt.Errorf("--data-cache-dir %s is a file; it wants a folder", c.dataCacheDir))
		} else if err != nil {
			if err := checkOutputDir("data-cache-dir", c.dataCacheDir); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if c.dump != "" {
		if err := checkOutputDir("dump", c.dump); err != nil {
			errs = append(errs, err)
		}
		if name := foreignDumpFile(c.dump); name != "" {
			errs = append(errs, fmt.Errorf("--dump %s holds %s, which is not a dump's: a dump replaces index.html, schedule.txt and NN-*.gir in its folder; dump into another folder, or move the file", c.dump, name))
		}
		// A dump replaces the NN-*.gir, index.html and schedule.txt in
		// its folder: an input among them would be removed before it is
		// read (a .gir reloaded from the dump it came from, say).
		for _, in := range c.inputPaths() {
			if isDumpFile(filepath.Base(in.path)) && samePath(filepath.Dir(in.path), c.dump) {
				what := "--" + in.flag + " " + in.path
				if in.flag == "" {
					what = "the model file " + in.path
				}
				errs = append(errs, fmt.Errorf("%s is in --dump %s, whose NN-*.gir, index.html and schedule.txt every dump replaces: it would be removed before it is read; copy it out, or dump into another folder", what, c.dump))
			}
		}
	}
	return errors.Join(errs...)
}

// checkOutputFile checks that path can be written as a file by --flag:
// its folder exists or can be created, a file can be created in it (the
// outputs are written next to their path and renamed over it), and an
// existing file at path is a regular file that can be opened for writing.
// A link is checked as the file it leads to, which the output replaces.
// The probe leaves everything as it found it: an existing file is opened
// without truncation and closed, and the probe file and any folder made
// for it are removed.
func checkOutputFile(flag, path string) error {
	// Each output is written to a temporary file beside it named after it
	// (.NAME.PID@HOST.RANDOM.tmp, runtime.TempNameOverhead bytes more),
	// then renamed: a name a file system
	// takes but not its temporary failed after training.
	if n := len(filepath.Base(path)); n > maxOutputName {
		return fmt.Errorf("--%s %s: a file name of %d bytes; written through a temporary file %d bytes longer, past file systems' 255, it takes at most %d", flag, path, n, runtime.TempNameOverhead, maxOutputName)
	}
	if strings.HasSuffix(path, string(filepath.Separator)) || strings.HasSuffix(path, "/.") || path == "." || path == ".." {
		// The folder need not exist: the writer would make it, then fail
		// to rename the file over it, after the training.
		return fmt.Errorf("--%s %s names a folder; it wants a file path (such as %s)", flag, path, filepath.Join(path, outputExample(flag)))
	}
	fi, err := os.Stat(path)
	switch {
	case err == nil && fi.IsDir():
		return fmt.Errorf("--%s %s is a folder; it wants a file path", flag, path)
	case err == nil && !fi.Mode().IsRegular():
		// A device or pipe: writing next to it and renaming over it
		// would replace it (as root, /dev/null).
		return fmt.Errorf("--%s %s is not a regular file (%s); it wants a file path", flag, path, filekind.Of(fi.Mode()))
	case err == nil:
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			return fmt.Errorf("--%s %s cannot be written: %w", flag, path, err)
		}
		if err := f.Close(); err != nil {
			return fmt.Errorf("--%s %s cannot be written: %w", flag, path, err)
		}
	case !errors.Is(err, fs.ErrNotExist):
		// A part of the path that is a file, a folder that cannot be
		// searched.
		return pathErr(flag, path, err)
	}
	// An output is written through a link to where it leads
	// (linkpath.Target): the temporary file goes beside the target.
	target := linkpath.Target(path)
	if n := len(filepath.Base(target)); target != path && n > maxOutputName {
		return fmt.Errorf("--%s %s: a link to %s, a file name of %d bytes; written through a temporary file %d bytes longer, past file systems' 255, it takes at most %d", flag, path, target, n, runtime.TempNameOverhead, maxOutputName)
	}
	return probeFolder(flag, filepath.Dir(target))
}

// pathErr is the error of a flag's path whose stat failed other than by
// its absence: a folder on the way that is a file is named as such (the
// stat says only "not a directory"), and any other failure is the
// system's reason.
func pathErr(flag, path string, err error) error {
	if errors.Is(err, syscall.ENOTDIR) {
		for d := filepath.Dir(path); d != filepath.Dir(d); d = filepath.Dir(d) {
			if fi, serr := os.Stat(d); serr == nil && !fi.IsDir() {
				return fmt.Errorf("--%s %s: %s is %s, not a folder", flag, path, d, filekind.Of(fi.Mode()))
			}
		}
	}
	return fmt.Errorf("--%s %s: %w", flag, path, reason(err))
}

// reason is err without the operation and path an *fs.PathError repeats
// (the message names the path already, and the probe's file is not the
// user's).
func reason(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// checkOutputDir checks that dir is, or can be made, a folder that files
// can be written in.
func checkOutputDir(flag, dir string) error {
	fi, err := os.Stat(dir)
	switch {
	case err == nil && !fi.IsDir():
		return fmt.Errorf("--%s %s is a file; it wants a folder", flag, dir)
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return pathErr(flag, dir, err)
	}
	return probeFolder(flag, dir)
}

// probeFolder checks that dir can be written in, or made where it is
// missing: it writes and removes a file in dir, or a folder of its own in
// the deepest folder above dir that exists. It makes none of dir's missing
// folders, so a refused run leaves no trace, the processes of one job can
// probe the same folder at once, and the writers make the folder when they
// write.
func probeFolder(flag, dir string) error {
	d := dir
	for {
		fi, err := os.Stat(d)
		if err == nil && !fi.IsDir() {
			return fmt.Errorf("--%s: cannot create the folder %s: %s is a file", flag, dir, d)
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("--%s: cannot create the folder %s: %w", flag, dir, reason(err))
		}
		if err == nil || filepath.Dir(d) == d {
			break
		}
		d = filepath.Dir(d)
	}
	if d == dir {
		f, err := os.CreateTemp(dir, ".gcompile-probe-*")
		if err != nil {
			return fmt.Errorf("--%s: cannot write in %s: %w", flag, dir, reason(err))
		}
		name := f.Name()
		cerr := f.Close()
		if rerr := os.Remove(name); rerr != nil && cerr == nil {
			cerr = rerr
		}
		if cerr != nil {
			return fmt.Errorf("--%s: cannot write in %s: %w", flag, dir, reason(cerr))
		}
		return nil
	}
	made, err := os.MkdirTemp(d, ".gcompile-probe-*")
	if err != nil {
		return fmt.Errorf("--%s: cannot create the folder %s: %w", flag, dir, reason(err))
	}
	if err := os.Remove(made); err != nil {
		return fmt.Errorf("--%s: cannot create the folder %s: %w", flag, dir, reason(err))
	}
	return nil
}

// checkInputFile checks that --flag names a file that can be read.
func checkInputFile(flag, path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("--%s: %w", flag, err)
	}
	if fi.IsDir() && flag == "load" {
		if _, err := checkpoint.Find(path); err == nil {
			return fmt.Errorf("--load %s is a checkpoint, which --resume reads (the model's weights with its training state); --load wants a safetensors file, or a folder holding model.safetensors", path)
		}
		return fmt.Errorf("--load %s is a folder holding neither model.safetensors nor model.safetensors.index.json; it wants a safetensors file, or a folder holding one of those", path)
	}
	if fi.IsDir() {
		return fmt.Errorf("--%s %s is a folder; it wants a file", flag, path)
	}
	if err := notAFile(flag, path); err != nil {
		return err
	}
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("--%s: %w", flag, err)
	}
	return f.Close()
}

// notAFile refuses an input that exists and is neither a regular file nor
// a folder: opening a pipe waits for a writer that may never come, and
// the run would hang before it says a word. A path that does not exist,
// or cannot be read, is left to the reader to name.
func notAFile(flag, path string) error {
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().IsRegular() || fi.IsDir() {
		return nil
	}
	what := "--" + flag
	if flag == "" {
		what = "the model"
	}
	return fmt.Errorf("%s %s is not a regular file (%s): it wants a file it can read to the end", what, path, filekind.Of(fi.Mode()))
}

// failWrite, in tests, replaces an output's write with one that fails (a
// disk filling up after the paths were probed, which nothing else makes
// happen to a root process).
var failWrite func(flag string, write func(string) error) func(string) error

// writeOutput writes one output of the run with write, creating its folder
// first (checkPaths made sure it can be, then left none behind), and names
// --flag in the error. Each output is written on its own: a failure is
// reported with the others', and never keeps another output from being
// written.
func writeOutput(flag, path string, write func(path string) error) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("--%s: %w", flag, err)
	}
	if failWrite != nil {
		write = failWrite(flag, write)
	}
	if err := write(path); err != nil {
		return fmt.Errorf("--%s: %w", flag, err)
	}
	return nil
}

// reportFolder creates --report's folder, which checkPaths made sure can
// be created and left none behind, before report.go writes the page into
// it; a failure is left to that write to report, naming --report.
func reportFolder(c *config) {
	if c.report != "" {
		_ = os.MkdirAll(filepath.Dir(c.report), 0o755)
	}
}

// refusedError is a failure of train before its first step: nothing was
// trained, so the outputs that record a run (the metrics) are not written
// over what a previous run left there.
type refusedError struct{ err error }

func (e refusedError) Error() string { return e.err.Error() }

func (e refusedError) Unwrap() error { return e.err }

// refused reports whether err is a run refused before its first step.
func refused(err error) bool {
	var r refusedError
	return errors.As(err, &r)
}

// earlierParts reads what the run's earlier parts recorded in the
// --metrics file path before this part resumes from checkpoint dir at
// step: their steps, evaluations and checkpoints up to step, when the
// file is the metrics of the part that saved dir (it lists that save by
// its ID, at that step), so that rerunning a command with --resume
// extends the file rather than replacing a whole run's record with its
// last part. Any other file (another run's, one that does not parse, a
// part killed before it wrote its metrics) is replaced as before, and
// nil is returned.
func earlierParts(path, dir string, step int) *runtime.Metrics {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var old runtime.Metrics
	if json.Unmarshal(raw, &old) != nil {
		return nil
	}
	// The checkpoint the file lists must be this one, not a folder of
	// the same path and step another run wrote since: its ID (creation
	// time, files' checksums) says which save it is.
	m, err := checkpoint.ReadManifest(dir)
	if err != nil {
		return nil
	}
	id := m.ID()
	linked := false
	for _, ck := range old.Checkpoints {
		if ck.Step == step && ck.ID == id {
			linked = true
		}
	}
	if !linked {
		return nil
	}
	keep := &runtime.Metrics{}
	for _, s := range old.Steps {
		if s.Step <= step {
			keep.Steps = append(keep.Steps, s)
		}
	}
	for _, e := range old.Eval {
		if e.Step <= step {
			keep.Eval = append(keep.Eval, e)
		}
	}
	for _, ck := range old.Checkpoints {
		if ck.Step <= step {
			keep.Checkpoints = append(keep.Checkpoints, ck)
		}
	}
	return keep
}

// recordedSteps is how many steps the metrics file at path holds (0: none,
// or no such file).
func recordedSteps(path string) int {
	raw, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	var m struct {
		Steps []json.RawMessage `json:"steps"`
	}
	if json.Unmarshal(raw, &m) != nil {
		return 0
	}
	return len(m.Steps)
}

// carry puts the earlier parts' record before this part's in met.
func carry(met, earlier *runtime.Metrics) {
	if earlier == nil {
		return
	}
	// A finished run's rerun evaluates its last step again: that figure
	// is this part's.
	evals := earlier.Eval
	if len(met.Eval) > 0 {
		evals = slices.DeleteFunc(slices.Clone(evals), func(e runtime.EvalMetrics) bool { return e.Step >= met.Eval[0].Step })
	}
	met.Steps = append(slices.Clip(earlier.Steps), met.Steps...)
	met.Eval = append(slices.Clip(evals), met.Eval...)
	met.Checkpoints = append(slices.Clip(earlier.Checkpoints), met.Checkpoints...)
	met.Carried = len(earlier.Steps)
}

// outputsInTextData refuses the outputs of a run on a folder of text
// that would lie among the files it reads: a text output (metrics,
// report, trace, a dump's .gir files, a checkpoint's manifest, the logs)
// written there becomes training text for the next run on the folder,
// and a --resume of it finds other data than the checkpoint's. A hidden
// folder inside --data is not read, and --save's weights, binary, are
// skipped by the loader.
func outputsInTextData(c *config) []error {
	if !c.run || c.data == "" || isTokenData(c.data) {
		return nil
	}
	if fi, err := os.Stat(c.data); err != nil || !fi.IsDir() {
		return nil
	}
	var errs []error
	// A process alone writes no log there (its log is the terminal).
	logDir := c.logDir
	if w, err := worldOf(c); c.launchProcs <= 1 && (err != nil || w.Size <= 1) {
		logDir = ""
	}
	for _, o := range []outputPath{{"metrics", c.metrics, nil}, {"report", c.report, nil}, {"trace", c.trace, nil}, {"timeline", c.timeline, nil},
		{"plan-trace", c.planTrace, nil}, {"dump", c.dump, nil}, {"checkpoint-dir", c.ckptDir, nil}, {"log-dir", logDir, nil}} {
		if o.path == "" || !(within(c.data, o.path) || samePath(c.data, o.path)) {
			continue
		}
		rel, err := filepath.Rel(realPath(c.data), realPath(o.path))
		if err == nil && slices.ContainsFunc(strings.Split(filepath.ToSlash(rel), "/"), func(p string) bool { return strings.HasPrefix(p, ".") && p != "." && p != ".." }) {
			continue // under a hidden folder, which the loader skips
		}
		errs = append(errs, fmt.Errorf("--%s %s is inside --data %s, whose text files every run on it reads: the next run would train on what this one writes there (and a --resume would find other data than its checkpoint's); give it a path outside --data, or in a hidden folder of it", o.flag, o.path, c.data))
	}
	return errs
}

// outputExample is a file name an output of flag could have, for a
// message's example path.
func outputExample(flag string) string {
	switch flag {
	case "save":
		return "model.safetensors"
	case "report":
		return "report.html"
	case "timeline":
		return "timeline.svg"
	}
	return flag + ".json"
}
