package main

import (
	"fmt"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"gcompile/compile"
	"gcompile/ir"
	"gcompile/lower"
	"gcompile/runtime"
	"gcompile/runtime/checkpoint"
)

// weightStore is how checkpoints reach a backend's params: whole tensors
// in and out, split and assembled by the cluster (cpu.Cluster and
// cuda.Cluster alike). In a job of several processes Global is
// collective and only process 0 gets the tensor.
type weightStore interface {
	Global(name string) ([]float64, error)
	SetGlobal(name string, x []float64) error
}

// params are the model's params over every pipeline rank's program, each
// once, by name: a pipeline splits them over its ranks.
func params(progs []*lower.Program) []lower.Buffer {
	byName := map[string]lower.Buffer{}
	for _, p := range progs {
		for _, b := range p.Buffers {
			if b.Kind == lower.Param {
				if _, ok := byName[b.Name]; !ok {
					byName[b.Name] = b
				}
			}
		}
	}
	out := make([]lower.Buffer, 0, len(byName))
	for _, b := range byName {
		out = append(out, b)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// saveWeights writes every param under its model name (HF GPT-2 names
// for the reference model), so other tools can read them. Every process
// of a job calls it; the one that writes is write. Errors name --save. The
// vocabulary tables in tables are written without their padding rows.
// about goes into the file's metadata beside its format (savedAbout: the
// model that trained, which generate and eval --load check).
func saveWeights(dev weightStore, progs []*lower.Program, path string, step int, write bool, tables map[string]int, about map[string]string) error {
	var ts []checkpoint.Tensor
	for _, b := range params(progs) {
		if b.Global.DType != ir.F32 {
			return fmt.Errorf("--save: param %q is %v; only f32 params are saved yet", b.Name, b.Global)
		}
		whole, err := dev.Global(b.Name)
		if err != nil {
			return fmt.Errorf("--save: param %q: %w", b.Name, err)
		}
		if !write {
			continue
		}
		x := make([]float32, len(whole))
		for i, v := range whole {
			x[i] = float32(v)
		}
		ts = append(ts, checkpoint.Tensor{Name: b.Name, DType: "F32", Shape: []int(b.Global.Shape.Clone()), Data: checkpoint.Float32Bytes(x)})
	}
	if !write {
		return nil
	}
	trimVocab(ts, tables)
	each, err := saveEach(params(progs))
	if err != nil {
		return fmt.Errorf("--save: %w", err)
	}
	if ts, err = checkpoint.SplitEach(ts, each); err != nil {
		return fmt.Errorf("--save: %w", err)
	}
	return writeOutput("save", path, func(path string) error {
		meta := map[string]string{"format": "pt", "producer": "gcompile", "step": strconv.Itoa(step)}
		maps.Copy(meta, about)
		return checkpoint.Save(path, ts, meta)
	})
}

// loadWeights overwrites params from a safetensors file (or the shards a
// Hugging Face index names); every param of the
// model, on every pipeline rank, must be present with its exact shape, as
// F32, or as BF16 or F16 widened exactly (published checkpoints are often
// 16-bit: Hugging Face Llama's are), and finite: a NaN or Inf weight makes
// every loss NaN from the first step, far from the file that caused it.
//
// With a vocabulary padded past the data's classes, a table of exactly
// classes rows (Hugging Face's vocab_size: GPT-2's 50257) loads into the
// first rows of a param of the padded size; the padding rows keep their
// initial values, which the loss never sees (nn.CrossEntropy masks them).
func loadWeights(dev weightStore, progs []*lower.Program, file string, ignore []string, classes int) error {
	ts, err := checkpoint.LoadIndexed(file)
	if err != nil {
		return fmt.Errorf("--load: %w", err)
	}
	err = loadTensors(dev, progs, ts, "--load "+file, ignore, classes)
	if meta := savedMetadata(file); err != nil && classes == 0 && meta != nil && strings.Contains(meta["data"], ";tokenizer ") {
		// A table of the tokenizer's vocabulary met the model's default
		// one: the flag that gives the model its vocabulary is named.
		// export --tokenizer writes the tokenizer's files beside the
		// weights, as Hugging Face's folders hold them.
		hint := "give that --tokenizer"
		switch tok, merges := tokenizerBeside(filepath.Dir(file)); {
		case tok != "" && merges == "":
			hint = fmt.Sprintf("give that --tokenizer (%s lies beside the weights: --tokenizer %s)", tok, filepath.Dir(tok))
		case tok != "":
			hint = fmt.Sprintf("give that --tokenizer (%s and merges.txt lie beside the weights: --tokenizer %s --merges %s)", tok, tok, merges)
		}
		err = fmt.Errorf("%w\n  the weights' run read its data with a tokenizer, whose size sets the model's vocabulary: %s", err, hint)
	}
	return err
}

// loadTensors is loadWeights of tensors read already (a safetensors file,
// a consolidated checkpoint); from names the source in errors.
func loadTensors(dev weightStore, progs []*lower.Program, ts []checkpoint.Tensor, from string, ignore []string, classes int) error {
	ps := params(progs)
	each, err := saveEach(ps)
	if err != nil {
		return fmt.Errorf("%s: %w", from, err)
	}
	wanted, shapes := map[string]bool{}, map[string][]int{}
	for _, b := range ps {
		wanted[b.Name] = true
		shapes[b.Name] = []int(b.Global.Shape)
	}
	// The pieces a stacked param is saved as (its experts) are the
	// model's names too.
	piece := map[string]bool{}
	for name, s := range each {
		for i := range shapes[name][0] {
			piece[s.Name(i)] = true
		}
	}
	ignored := func(name string) bool {
		return slices.ContainsFunc(ignore, func(p string) bool { ok, _ := path.Match(p, name); return ok })
	}
	// A pattern is for tensors the model has no param for: every param is
	// loaded from the file, so one that matches a param would be taken
	// for "leave this param at its initial value" and silently not do it.
	for _, b := range ps {
		for _, p := range ignore {
			if ok, _ := path.Match(p, b.Name); ok {
				return fmt.Errorf("%s: ignore pattern %q matches the model's param %s: --load-ignore skips tensors of the file that are no param of the model, and every param is loaded from the file; narrow the pattern", from, p, b.Name)
			}
		}
	}
	// A wrapper's prefix is dropped where the rest of the name is the
	// model's: Hugging Face's GPT2LMHeadModel writes "transformer.h.0…",
	// DDP "module.…", torch.compile "_orig_mod.…".
	inFile := map[string]bool{}
	for _, t := range ts {
		inFile[t.Name] = true
	}
	// Two tensors whose names differ only there (a model's "model.…"
	// beside an EMA copy's "ema.…") are one param twice: the later had
	// silently won.
	renamedFrom := map[string]string{}
	for i, t := range ts {
		if wanted[t.Name] || piece[t.Name] || ignored(t.Name) {
			continue
		}
		if _, rest, ok := strings.Cut(t.Name, "."); ok && !inFile[rest] && (wanted[rest] || piece[rest] || ignored(rest)) {
			if other, ok := renamedFrom[rest]; ok {
				return fmt.Errorf("%s: tensors %s and %s are both the model's %s once their first name part is dropped (as a wrapper's prefix: transformer., module.): which to load is not known; skip the other's with --load-ignore '%s'", from, other, t.Name, rest, strings.SplitN(t.Name, ".", 2)[0]+".*")
			}
			renamedFrom[rest] = t.Name
			ts[i].Name = rest
		}
	}
	if ts, err = checkpoint.JoinEach(ts, each, shapes); err != nil {
		return fmt.Errorf("%s: %w", from, err)
	}
	byName := map[string]checkpoint.Tensor{}
	for _, t := range ts {
		byName[t.Name] = t
	}
	// A tensor the model has no param for is a mistake (another model's
	// from, a renamed layer) unless the model ignores it on purpose.
	var extra []string
	for _, t := range ts {
		if !wanted[t.Name] && !ignored(t.Name) {
			extra = append(extra, t.Name)
		}
	}
	if len(extra) > 0 {
		sort.Strings(extra)
		shown := extra[:min(len(extra), 8)]
		more := ""
		if len(extra) > len(shown) {
			more = fmt.Sprintf(" and %d more", len(extra)-len(shown))
		}
		return fmt.Errorf("%s: %d tensor(s) are no param of the model: %s%s (load a checkpoint of this model, or skip them on purpose with --load-ignore; ignored now: %q)", from, len(extra), strings.Join(shown, ", "), more, ignore)
	}
	// Every param the file lacks, as extra tensors are listed: a model of
	// more layers, or a file of another model, lacks many.
	var missing []string
	for _, b := range ps {
		if _, ok := byName[b.Name]; !ok {
			missing = append(missing, b.Name)
		}
	}
	if len(missing) > 0 {
		if len(byName) == 0 {
			return fmt.Errorf("%s: the file holds no tensors, and the model has %d params", from, len(ps))
		}
		shown := missing[:min(len(missing), 8)]
		more := ""
		if len(missing) > len(shown) {
			more = fmt.Sprintf(" and %d more", len(missing)-len(shown))
		}
		return fmt.Errorf("%s: %d of the model's %d params have no tensor in it: %s%s (weights of another model, or of this one with other --set sizes?)", from, len(missing), len(ps), strings.Join(shown, ", "), more)
	}
	for _, b := range ps {
		t := byName[b.Name]
		dt := loadableDType[t.DType]
		padded := padsVocab(t.Shape, b.Global.Shape, classes)
		if b.Global.DType != ir.F32 || dt == ir.Invalid || !(ir.Shape(t.Shape).Equal(b.Global.Shape) || padded) {
			return fmt.Errorf("%s: tensor %q is %s%v, the model's param is %v (F32, BF16 or F16 tensors of its shape load into an f32 param)", from, b.Name, t.DType, t.Shape, b.Global)
		}
		whole, err := runtime.Decode(ir.T(dt, t.Shape...), t.Data)
		if err != nil {
			return fmt.Errorf("%s: tensor %q: %w", from, b.Name, err)
		}
		if msg := checkpoint.NonFinite(t.DType, t.Data); msg != "" {
			return fmt.Errorf("%s: tensor %q: %s (a diverged run's weights? load a checkpoint from before it)", from, b.Name, msg)
		}
		if padded {
			init, err := dev.Global(b.Name)
			if err != nil {
				return err
			}
			copy(init, whole) // the rows come first in row-major order
			whole = init
		}
		if err := dev.SetGlobal(b.Name, whole); err != nil {
			return err
		}
	}
	return nil
}

// saveEach are the params of ps that weight files hold as pieces of their
// own (ir.SaveEach: a MoE layer's experts under Hugging Face's names), by
// name.
func saveEach(ps []lower.Buffer) (map[string]ir.SaveEach, error) {
	var out map[string]ir.SaveEach
	for _, b := range ps {
		s, ok, err := ir.ParamSaveEach(b.Value)
		if err != nil {
			return nil, err
		}
		if !ok {
			continue
		}
		if out == nil {
			out = map[string]ir.SaveEach{}
		}
		out[b.Name] = s
	}
	return out, nil
}

// padsVocab says whether a file's tensor of shape file is a vocabulary
// table of exactly classes rows for a param of shape param padded past
// them: the same but for more rows.
func padsVocab(file []int, param ir.Shape, classes int) bool {
	if classes <= 0 || len(file) != len(param) || len(file) == 0 || file[0] != classes || param[0] <= classes {
		return false
	}
	return slices.Equal(file[1:], []int(param[1:]))
}

// loadableDType is the dtype of a safetensors tensor --load widens into an
// f32 param.
var loadableDType = map[string]ir.DType{"F32": ir.F32, "BF16": ir.BF16, "F16": ir.F16}

// ignoredOnLoad are the patterns of tensors --load skips: the model's own
// (b.IgnoreOnLoad) and the user's (--load-ignore).
func (c *config) ignoredOnLoad(model []string) []string { return ignorePatterns(model, c.loadIgnore) }

// ignorePatterns is the model's own patterns and those of a
// --load-ignore list.
func ignorePatterns(model []string, flag string) []string {
	out := slices.Clone(model)
	for _, p := range strings.Split(flag, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// savedAbout is what --save's metadata says of the model that trained:
// its name, --set, fingerprint and the batch it was built at (the
// fingerprint's), and the data it trained on with its tokenizer's files
// (which generate and eval --load take when given none), so that generate and eval
// --load can tell another model whose params have the same shapes
// (savedModel).
func savedAbout(c *config, res *compile.Result) map[string]string {
	about := map[string]string{"model": res.Module.Name, "set": c.Set, "model_fingerprint": res.ModelFingerprint, "batch": strconv.Itoa(c.Batch)}
	if strings.HasSuffix(c.Model, ".gir") {
		delete(about, "model_fingerprint") // no model file to build again
	}
	if d := c.dataIdentity(); d != "" {
		about["data"] = d
	}
	if files := c.tokenizerFiles(); len(files) > 0 {
		about["tokenizer"] = files[0]
		if len(files) > 1 {
			about["merges"] = files[1]
		}
	}
	return about
}

// weightsFile is the file --load reads for path: a folder (Hugging
// Face's from_pretrained takes one, and export writes one) is its
// model.safetensors.index.json, or else its model.safetensors; anything
// else is path itself, which the input checks then name.
func weightsFile(path string) string {
	if !isFolder(path) {
		return path
	}
	for _, name := range []string{"model.safetensors.index.json", "model.safetensors"} {
		if f := filepath.Join(path, name); isRegularFile(f) {
			return f
		}
	}
	return path
}

// isRegularFile says whether path names a regular file (after links).
func isRegularFile(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular()
}
