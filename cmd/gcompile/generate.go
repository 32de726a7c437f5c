package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"gcompile/compile"
	"gcompile/data/tokenizer"
	"gcompile/frontend"
	"gcompile/frontend/loader"
	"gcompile/generate"
	"gcompile/ir"
	"gcompile/lower"
	"gcompile/passes"
	"gcompile/runtime"
	"gcompile/runtime/checkpoint"
	"gcompile/runtime/cpu"
	"gcompile/runtime/cuda"
	"gcompile/runtime/dist"
)

// genConfig is `gcompile generate`'s command line.
type genConfig struct {
	compile.Config
	load, loadIgnore, resume string
	prompt, promptFile       string
	maxNew, context, batch   int
	sampling                 generate.Sampling
	stops                    []string
	output                   string
	tokenizer, merges        string
	tokenizerNote            string // the run's tokenizer taken (defaultTokenizer)
	bos                      bool
	vocabDivisible           int
	dump, deviceMemory       string
	backend                  string
	packGPU                  bool
}

// generateMain is `gcompile generate MODEL.go --load W|--resume CKPT
// --prompt TEXT|--prompt-file F`: the model compiled for generation (a
// prefill and a decode program with key/value caches, under the plan's
// dp and tp), its weights loaded, and each prompt continued.
func generateMain(args []string) error { return runGenerate(args, os.Stdout, os.Stderr) }

func parseGenerate(args []string) (*genConfig, error) {
	g := &genConfig{}
	fs := newSubcommandFlags("generate", "MODEL.go (--load W | --resume CKPT) (--prompt TEXT | --prompt-file F) [flags]")
	fs.Var(setFlag{&g.Set}, "set", "model parameters key=value,… as the weights were trained with; a second --set adds to the first, a key given again taking its new value")
	fs.IntVar(&g.Devices, "devices", 1, "devices to generate on")
	fs.IntVar(&g.TP, "tp", 0, "tensor-parallel degree: heads and the MLP split over tp devices (0: 1)")
	fs.IntVar(&g.DP, "dp", 0, "data-parallel degree: prompts split over dp devices (0: the devices left over)")
	// Training's plan flags that generation does not have are accepted to
	// be refused by name (compile.CheckGenerationPlan).
	fs.IntVar(&g.PP, "pp", 0, "pipeline-parallel degree (generation: 1)")
	fs.IntVar(&g.EP, "ep", 0, "expert-parallel degree (generation: 1)")
	fs.IntVar(&g.CP, "cp", 0, "context-parallel degree (generation: 1)")
	fs.IntVar(&g.Zero, "zero", 0, "ZeRO stage (generation: 0)")
	fs.BoolVar(&g.SequenceParallel, "sequence-parallel", false, "sequence parallelism (generation: off)")
	fs.StringVar(&g.Precision, "precision", "fp32", "generation runs in fp32")
	fs.StringVar(&g.load, "load", "", "the weights: a safetensors file, a Hugging Face model.safetensors.index.json, or a folder holding either (as export writes it)")
	fs.StringVar(&g.loadIgnore, "load-ignore", "", "with --load: tensors of the file that are no param of the model, skipped on purpose (comma-separated glob patterns)")
	fs.StringVar(&g.resume, "resume", "", "the weights of a training checkpoint: a --checkpoint-dir (its latest complete checkpoint) or one step-N folder")
	fs.StringVar(&g.prompt, "prompt", "", "the text to continue")
	fs.StringVar(&g.promptFile, "prompt-file", "", "a file of prompts, one per line (LF or CRLF; a leading byte-order mark dropped), generated as one batch")
	fs.IntVar(&g.maxNew, "max-new-tokens", 64, "tokens to generate per prompt at most")
	fs.IntVar(&g.batch, "batch", 0, "prompts generated together in one step (0: all of them); rounded up to a multiple of dp, with a note")
	fs.IntVar(&g.context, "context", 0, "positions each key/value cache holds (0: the longest prompt plus --max-new-tokens)")
	fs.Float64Var(&g.sampling.Temperature, "temperature", 1, "softmax temperature (0: greedy, the most likely token)")
	fs.IntVar(&g.sampling.TopK, "top-k", 0, "sample among the k most likely tokens (0: all)")
	fs.Float64Var(&g.sampling.TopP, "top-p", 1, "sample among the most likely tokens whose probability reaches p (nucleus; 1: all)")
	fs.Float64Var(&g.sampling.RepetitionPenalty, "repetition-penalty", 1, "divide the positive logits of tokens the sequence already holds (prompt and output) by this, and multiply the negative ones, as Hugging Face's repetition_penalty (1: none; above 1 discourages repeats)")
	var seed int64
	fs.Int64Var(&seed, "seed", 1, "sampling seed: the same seed gives the same tokens under every plan")
	fs.Func("stop", "end a prompt's generation where its text contains this string (repeatable; the string is not printed)", func(s string) error {
		if s == "" {
			return errors.New("an empty stop string would stop at once")
		}
		g.stops = append(g.stops, s)
		return nil
	})
	fs.StringVar(&g.output, "output", "text", "text (the continuations; one prompt's streamed as it is made, several printed at the end) or json (one object per prompt: prompt, prompt_ids, ids, text, stop)")
	fs.StringVar(&g.tokenizer, "tokenizer", "", "the Hugging Face tokenizer.json (or its folder) of the model's vocabulary (default: bytes, one token per byte)")
	fs.StringVar(&g.merges, "merges", "", "with --tokenizer vocab.json: GPT-2's merges.txt")
	fs.BoolVar(&g.bos, "bos", false, "with --tokenizer: begin every prompt with the tokenizer's BOS token, as Hugging Face's Llama tokenizers do (data prepared by gcompile has none unless data prepare --bos wrote it)")
	fs.IntVar(&g.vocabDivisible, "make-vocab-size-divisible-by", 128, "with --tokenizer: the model's vocab is the tokenizer's padded to a multiple of this times --tp, as in training")
	fs.StringVar(&g.dump, "dump", "", "write the decode program's module after each pass, and index.html, to this folder")
	fs.StringVar(&g.deviceMemory, "device-memory", "", "memory per device, e.g. 16GiB: programs and caches that do not fit are refused")
	fs.StringVar(&g.backend, "backend", "cpu", "cpu|cuda")
	modelTimeoutFlag(fs, &g.ModelTimeout)
	fs.BoolVar(&g.packGPU, "pack-gpu", false, "with --backend cuda: every device on one GPU as virtual devices, instead of one GPU each")
	positional, err := parsePositional(fs, args)
	if err != nil {
		return nil, err
	}
	if len(positional) != 1 {
		return nil, fmt.Errorf("generate: want exactly one MODEL.go, got %d arguments (see gcompile generate -h)", len(positional))
	}
	g.Model = positional[0]
	if err := checkModelFile(g.Model); err != nil {
		return nil, fmt.Errorf("generate: %w", err)
	}
	g.sampling.Seed = uint64(seed)
	explicit := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { explicit[f.Name] = true })
	return g, g.validate(explicit)
}

// validate refuses a bad command line before any work, naming every
// mistake at once.
func (g *genConfig) validate(explicit map[string]bool) error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if !strings.HasSuffix(g.Model, ".go") {
		bad("generate %s: want a MODEL.go (generation builds the model again, at one token per step)", g.Model)
	}
	g.load = weightsFile(g.load)
	g.tokenizerNote = defaultTokenizer(&g.tokenizer, &g.merges, g.resume, g.load)
	for _, in := range []outputPath{{"", g.Model, nil}, {"load", g.load, nil}, {"prompt-file", g.promptFile, nil}, {"tokenizer", g.tokenizer, nil}} {
		if err := notAFile(in.flag, in.path); err != nil {
			return err // before anything reads it: a pipe would hang the read
		}
	}
	if fi, err := os.Stat(g.promptFile); g.promptFile != "" && err == nil && fi.IsDir() {
		bad("--prompt-file %s is a folder; it wants a file of prompts, one a line", g.promptFile)
	}
	if g.dump != "" {
		if err := checkOutputDir("dump", g.dump); err != nil {
			errs = append(errs, err)
		}
		// Among checkpoints the dump's files mix with the steps': a dump
		// named like a step's folder made that step unloadable.
		switch ck := enclosingCheckpoint(g.dump); {
		case g.resume != "" && (within(g.resume, g.dump) || samePath(g.resume, g.dump)):
			bad("--dump %s is inside --resume %s: its files would mix with the checkpoints' (a dump named like a step's folder takes it); dump into a folder outside", g.dump, g.resume)
		case ck != "":
			bad("--dump %s is inside checkpoint %s: its files would mix with that checkpoint's; dump into a folder outside", g.dump, ck)
		}
	}
	switch {
	case g.load == "" && g.resume == "":
		bad("generate: give the weights with --load FILE.safetensors or --resume CHECKPOINT")
	case g.load != "" && g.resume != "":
		bad("generate: --load and --resume both give the weights; give one")
	}
	switch {
	case explicit["prompt"] == (g.promptFile != ""):
		bad("generate: give the text with --prompt TEXT or --prompt-file FILE (one of them)")
	case explicit["prompt"] && g.prompt == "" && !g.bos:
		bad("--prompt \"\": the prompt is empty; there is no token to continue from (with --bos it is the BOS token alone)")
	}
	if g.maxNew < 1 || g.maxNew > maxPositions {
		bad("--max-new-tokens %d: want 1 to %d", g.maxNew, maxPositions)
	}
	if g.vocabDivisible < 1 || g.vocabDivisible > maxVocabDivisible {
		bad("--make-vocab-size-divisible-by %d: want 1 to %d", g.vocabDivisible, maxVocabDivisible)
	}
	if g.batch < 0 {
		bad("--batch %d: want a number of prompts per step (0: all of them)", g.batch)
	}
	if g.context < 0 || g.context > maxPositions {
		bad("--context %d: want a number of positions up to %d (0: the longest prompt plus --max-new-tokens)", g.context, maxPositions)
	}
	if err := g.sampling.Validate(); err != nil {
		errs = append(errs, err)
	} else if g.sampling.RepetitionPenalty == 0 {
		// Sampling reads 0 as none, as 1: given, it is a mistake.
		bad("--repetition-penalty 0: want a finite penalty > 0 (1: none)")
	}
	if g.output != "text" && g.output != "json" {
		bad("--output %q: want text or json", g.output)
	}
	if g.backend != "cpu" && g.backend != "cuda" {
		bad("--backend %q: want cpu or cuda", g.backend)
	}
	if g.packGPU && g.backend != "cuda" {
		bad("--pack-gpu needs --backend cuda")
	}
	if g.bos && g.tokenizer == "" {
		bad("--bos needs --tokenizer (a byte-level model has no BOS token)")
	}
	if g.merges != "" && g.tokenizer == "" {
		bad("--merges needs --tokenizer vocab.json")
	}
	if g.deviceMemory != "" {
		n, err := parseBytes(g.deviceMemory)
		if err != nil {
			bad("--device-memory %q: %w", g.deviceMemory, err)
		}
		g.MemLimit = n
	}
	if g.loadIgnore != "" && g.load == "" {
		bad("--load-ignore needs --load")
	}
	for _, p := range strings.Split(g.loadIgnore, ",") {
		if _, err := path.Match(p, ""); err != nil {
			bad("--load-ignore pattern %q: %v", p, err)
		}
	}
	// The plan: dp and tp only (compile.CheckGenerationPlan).
	g.Microbatches, g.Optimizer, g.DPSync, g.Recompute = 1, "adamw", "sync", "none"
	g.BucketMB, g.Clip, g.Beta1, g.Beta2 = 25, 1, 0.9, 0.95
	g.Batch = max(g.DP, 1) // a placeholder until the prompts are counted, which dp divides
	g.Explicit = explicit
	if len(errs) == 0 {
		// What generation cannot run first: a plan of such an axis would
		// otherwise be refused for the rules of a training plan over it.
		if err := compile.CheckGenerationPlan(&g.Config); err != nil {
			errs = append(errs, err)
		} else if err := g.Config.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// codec is how prompts become ids and ids text: a tokenizer, or bytes.
type codec struct {
	tok *tokenizer.Tokenizer
}

func (t codec) encode(s string) []int32 {
	if t.tok != nil {
		return t.tok.Encode([]byte(s))
	}
	ids := make([]int32, len(s))
	for i := range len(s) {
		ids[i] = int32(s[i])
	}
	return ids
}

func (t codec) decode(ids []int32, eos int32) string {
	if len(ids) > 0 && ids[len(ids)-1] == eos {
		ids = ids[:len(ids)-1]
	}
	if t.tok != nil {
		return string(t.tok.Decode(ids))
	}
	// An id past the bytes (a model built with --set vocab above 256)
	// has no byte: it shows as U+FFFD, as bytes that are not UTF-8 do.
	b := make([]byte, 0, len(ids))
	for _, id := range ids {
		if id < 0 || id > 255 {
			b = utf8.AppendRune(b, utf8.RuneError)
			continue
		}
		b = append(b, byte(id))
	}
	return string(b)
}

// joinTail is how many of a prompt's last tokens decode with a
// continuation to find its text: enough for any merge or byte sequence
// across the join, few enough that decoding each new token stays cheap
// behind a long prompt.
const joinTail = 16

// continuation is the text generated after prompt: the decode of the
// prompt's tail with the new ids, less the tail's own decode. Decoded on
// their own, the new ids would lose what a tokenizer's decoder does at
// the start of a text (SentencePiece's "strip one leading space": the
// space before the first new word) and bytes of a character split
// across the join.
func (t codec) continuation(prompt, ids []int32, eos int32) string {
	if len(ids) > 0 && ids[len(ids)-1] == eos {
		ids = ids[:len(ids)-1]
	}
	if t.tok != nil && t.onlyBOS(prompt) {
		// No text before the new ids (--bos and an empty prompt): they
		// start the text, as Hugging Face decodes them; after the BOS a
		// SentencePiece decoder would keep the space it strips there.
		return t.decode(ids, -1)
	}
	tail := prompt[max(len(prompt)-joinTail, 0):]
	head := t.decode(tail, -1)
	full := t.decode(append(slices.Clone(tail), ids...), -1)
	if rest, ok := strings.CutPrefix(full, head); ok {
		return rest
	}
	return t.decode(ids, -1)
}

// onlyBOS says whether prompt is the tokenizer's BOS alone.
func (t codec) onlyBOS(prompt []int32) bool {
	bos, ok := t.tok.BOS()
	return ok && len(prompt) == 1 && prompt[0] == bos
}

// readPrompts is --prompt, or --prompt-file's lines (a last newline ends
// the last prompt; any other empty line is an empty prompt, refused
// unless --bos gives it a token).
func (g *genConfig) readPrompts() ([]string, error) {
	if g.promptFile == "" {
		return []string{g.prompt}, nil
	}
	raw, err := os.ReadFile(g.promptFile)
	if err != nil {
		return nil, fmt.Errorf("--prompt-file: %w", err)
	}
	// A byte-order mark (an editor's UTF-8 file) is not the first
	// prompt's text; CRLF line ends are LF ones.
	s := strings.ReplaceAll(strings.TrimPrefix(string(raw), "\ufeff"), "\r\n", "\n")
	if s == "" {
		return nil, fmt.Errorf("--prompt-file %s: no prompts (the file is empty)", g.promptFile)
	}
	// The last newline ends the last prompt: "\n" is one empty prompt.
	lines := strings.Split(strings.TrimSuffix(s, "\n"), "\n")
	for i, l := range lines {
		if l == "" && !g.bos {
			return nil, fmt.Errorf("--prompt-file %s:%d: the prompt is empty; there is no token to continue from (with --bos it is the BOS token alone)", g.promptFile, i+1)
		}
	}
	return lines, nil
}

// genResult is --output json's object for one prompt.
type genResult struct {
	Prompt    string  `json:"prompt"`
	PromptIDs []int32 `json:"prompt_ids"`
	IDs       []int32 `json:"ids"`
	Text      string  `json:"text"`
	// Stop is why generation ended: "eos", "stop" (a --stop string) or
	// "length" (--max-new-tokens).
	Stop string `json:"stop"`
}

func runGenerate(args []string, stdout, stderr io.Writer) (err error) {
	g, err := parseGenerate(args)
	if err != nil {
		return err
	}
	// Generation runs in one process: started as several by a launcher
	// (or in a batch script whose environment names a world), rank 0
	// generates and the others step aside, rather than each printing the
	// same text.
	w, err := dist.FromEnv(os.Getenv)
	if err != nil {
		// Which rank this is cannot be told: each would generate, or none.
		return fmt.Errorf("generate: the launcher's environment: %w", err)
	}
	if w.Size > 1 && w.Rank > 0 {
		fmt.Fprintf(stderr, "generate: rank %d of %d (%s) leaves generation to rank 0: it runs in one process, over --devices\n", w.Rank, w.Size, w.Launcher)
		return nil
	}
	if g.load != "" {
		// Before any work, the weights being read after the compile; on
		// rank 0 only, where they are read.
		if err := checkInputFile("load", g.load); err != nil {
			return err
		}
	}
	tx := codec{}
	eos := int32(-1)
	if g.tokenizerNote != "" {
		fmt.Fprintln(stderr, g.tokenizerNote)
	}
	if g.tokenizer != "" {
		if tx.tok, err = tokenizer.Load(g.tokenizer, g.merges); err != nil {
			return fmt.Errorf("--tokenizer: %w", err)
		}
		if id, ok := tx.tok.EOS(); ok {
			eos = id
		}
		g.Classes = tx.tok.VocabSize()
		if _, ok := setValue(g.Set, "vocab"); !ok {
			g.Set = strings.TrimPrefix(g.Set+",vocab="+fmt.Sprint(resumedVocab(g.resume, g.Classes, g.vocabDivisible, g.TP)), ",")
		}
	}
	if g.resume != "" {
		// The tokenizer first: another tokenizer's size pads another
		// vocabulary, which the model's check would blame on the model.
		if err := resumedTokenizer(g.resume, tx.tok, g.tokenizer); err != nil {
			return err
		}
		if _, err := checkpointModel(g.Config, g.resume, ""); err != nil {
			return err
		}
	}
	if g.load != "" {
		if err := loadedTokenizer(g.load, tx.tok, g.tokenizer); err != nil {
			return err
		}
	}
	texts, err := g.readPrompts()
	if err != nil {
		return err
	}
	prompts := make([][]int32, len(texts))
	longest := 0
	var bos []int32
	if g.bos {
		id, ok := tx.tok.BOS()
		if !ok {
			return fmt.Errorf("--bos: the tokenizer %s has no BOS token", g.tokenizer)
		}
		bos = []int32{id}
	}
	for i, s := range texts {
		prompts[i] = append(append([]int32(nil), bos...), tx.encode(s)...)
		if len(prompts[i]) == 0 {
			return fmt.Errorf("%w: prompt %d encodes to no tokens", generate.ErrBadPrompt, i+1)
		}
		longest = max(longest, len(prompts[i]))
	}
	need := generate.Positions(longest, g.maxNew)
	context := g.context
	if context == 0 {
		context = need
	}
	if need > context {
		return fmt.Errorf("%w: the longest prompt has %d tokens and %d are to be generated: %d positions (the last new token is not fed back), past --context %d", generate.ErrBadPrompt, longest, g.maxNew, need, context)
	}
	dp := max(g.DP, 1)
	batch := len(prompts)
	if g.batch > 0 {
		batch = min(batch, g.batch)
	}
	if batch%dp != 0 {
		// The help says --batch is a multiple of dp: said, not silently
		// changed.
		fmt.Fprintf(stderr, "generate: %d sequences a batch rounded up to %d, a multiple of dp=%d (the extra rows run a one-token prompt whose results are dropped)\n", batch, (batch+dp-1)/dp*dp, dp)
	}
	batch = (batch + dp - 1) / dp * dp
	g.Batch = batch

	start := time.Now()
	d := newDumper(g.dump)
	hooks := d.hooks()
	var last *ir.Module
	if after := hooks.After; after != nil {
		hooks.After = func(r passes.Result, m *ir.Module) { last = m; after(r, m) }
	}
	gen, err := compile.CompileGeneration(&g.Config, nil, batch, longest, context, hooks)
	if last != nil {
		if derr := d.finish(last, err); derr != nil && err == nil {
			err = derr
		}
	}
	if err == nil {
		// The position table first: a context past it is the cause, not
		// the memory its caches would take.
		err = positionsFit(gen, g, context, need, longest)
	}
	for {
		// The prefill holds [batch·longest prompt, hidden] activations a
		// layer (and, for a head it cannot narrow to the last tokens,
		// [batch·longest prompt, vocab] logits): all the prompts together
		// may not fit (the device memory given, or the machine's on the
		// CPU backend, where the prefill and decode programs are checked
		// together) where a few at a time do. Without --batch, fewer a step, said; with it, the
		// refusal names the figures.
		if err == nil && g.backend == "cpu" {
			err = g.checkHostMemory(gen)
		}
		if err == nil {
			break
		}
		if g.batch > 0 || batch <= dp || !errors.Is(err, lower.ErrDoesNotFit) {
			return err
		}
		smaller := max(batch/2/dp*dp, dp)
		what, _, _ := strings.Cut(err.Error(), "\n")
		fmt.Fprintf(stderr, "generate: %d prompts a step do not fit (%s); %d a step instead (--batch sets it)\n", batch, what, smaller)
		batch = smaller
		g.Batch = batch
		gen, err = compile.CompileGeneration(&g.Config, nil, batch, longest, context, passes.Hooks{})
	}

	// The prompts against the model's vocabulary, before any weight is
	// read.
	req := generate.Request{Prompts: prompts, MaxNew: g.maxNew, Sampling: g.sampling, EOS: eos}
	shape := (&generate.Engine{Batch: batch, Prompt: longest, Context: context, Vocab: logitsWidth(gen.Decode)})
	if err := shape.Check(&req); err != nil {
		return err
	}
	if g.load != "" {
		note, err := savedModel(g.Config, g.load)
		if err != nil {
			return err
		}
		if note != "" {
			fmt.Fprintln(stderr, note)
		}
	}
	loadW := func(pre weightStore) error {
		progs := []*lower.Program{gen.Prefill}
		if g.load != "" {
			return loadWeights(pre, progs, g.load, ignorePatterns(gen.IgnoreOnLoad, g.loadIgnore), g.Classes)
		}
		return loadCheckpointParams(pre, progs, g.resume, gen.IgnoreOnLoad, g.Classes)
	}
	eng, device, closeAll, err := g.loadGeneration(gen, loadW)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, closeAll()) }()
	compiled := time.Since(start)

	out := &genOutput{g: g, tx: tx, eos: eos, texts: texts, prompts: prompts, w: bufio.NewWriter(stdout), stopped: make([]bool, len(prompts))}
	defer out.w.Flush()
	req.StopWhen = out.stopWhen
	t0 := time.Now()
	if out.streaming() {
		fmt.Fprint(out.w, texts[0])
		out.w.Flush()
		req.OnToken = out.onToken
	} else {
		// Nothing is printed until every prompt is done (JSON, several
		// prompts): say how far it is every few seconds, so a long
		// request does not look hung.
		made, last, total := 0, t0, len(prompts)*g.maxNew
		req.OnToken = func(int, int32) {
			made++
			if now := time.Now(); now.Sub(last) >= 5*time.Second {
				last = now
				fmt.Fprintf(stderr, "generate: %d of at most %d tokens in %.0f s\n", made, total, now.Sub(t0).Seconds())
			}
		}
	}
	ids, err := eng.Run(req)
	if err != nil {
		return err
	}
	elapsed := time.Since(t0)
	tokens, err := out.finish(ids)
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "generated %d tokens for %d prompt(s) in %.2f s (%.1f tokens/s; compiled and loaded in %.2f s) on %d %s device(s): %s and %s, key/value cache %s per device\n",
		tokens, len(prompts), elapsed.Seconds(), float64(tokens)/math.Max(elapsed.Seconds(), 1e-9), compiled.Seconds(), gen.Devices(), device,
		gen.Prefill.Name, gen.Decode.Name, lower.HumanBytes(compile.KVCacheBytes(gen.Decode)))
	return nil
}

// genOutput prints what generate made: a single prompt's text streamed
// as its tokens arrive, several prompts' texts when they are done, or one
// JSON object per prompt.
type genOutput struct {
	g       *genConfig
	tx      codec
	eos     int32
	texts   []string
	prompts [][]int32
	w       *bufio.Writer
	// stopped says which prompts a --stop string ended; made and printed
	// are the streamed prompt's tokens and the bytes of its text out.
	stopped []bool
	made    []int32
	printed int
}

func (o *genOutput) streaming() bool { return o.g.output == "text" && len(o.prompts) == 1 }

// stopWhen is the engine's StopWhen: whether prompt seq's text so far
// contains a --stop string.
func (o *genOutput) stopWhen(seq int, ids []int32) bool {
	if len(o.g.stops) == 0 {
		return false
	}
	_, hit := generate.StopAt(o.tx.continuation(o.prompts[seq], ids, o.eos), o.g.stops)
	o.stopped[seq] = o.stopped[seq] || hit
	return hit
}

// onToken prints the streamed text's new bytes, holding back those that
// may start a stop string or that end in the middle of a character.
func (o *genOutput) onToken(_ int, id int32) {
	o.made = append(o.made, id)
	s := o.tx.continuation(o.prompts[0], o.made, o.eos)
	if cut, ok := generate.StopAt(s, o.g.stops); ok {
		s = s[:cut]
	} else {
		s = s[:len(s)-generate.Holdback(s, o.g.stops)]
	}
	if s = completeRunes(s); len(s) > o.printed {
		fmt.Fprint(o.w, s[o.printed:])
		o.printed = len(s)
		o.w.Flush()
	}
}

// finish prints every prompt's result and returns how many tokens were
// made.
func (o *genOutput) finish(ids [][]int32) (int, error) {
	tokens := 0
	enc := json.NewEncoder(o.w)
	enc.SetEscapeHTML(false)
	for i, got := range ids {
		tokens += len(got)
		s := o.tx.continuation(o.prompts[i], got, o.eos)
		stop := "length"
		switch {
		case len(got) > 0 && got[len(got)-1] == o.eos:
			stop = "eos"
		case o.stopped[i]:
			stop = "stop"
			if cut, ok := generate.StopAt(s, o.g.stops); ok {
				s = s[:cut]
			}
		}
		switch {
		case o.g.output == "json":
			if err := enc.Encode(genResult{Prompt: o.texts[i], PromptIDs: o.prompts[i], IDs: got, Text: lossy(s), Stop: stop}); err != nil {
				return tokens, err
			}
		case o.streaming():
			if len(s) > o.printed {
				fmt.Fprint(o.w, s[o.printed:])
			}
			fmt.Fprintln(o.w)
		default:
			fmt.Fprintf(o.w, "%s%s\n", o.texts[i], s)
			if i+1 < len(ids) {
				fmt.Fprintln(o.w)
			}
		}
	}
	return tokens, nil
}

// checkHostMemory is the CPU backend's memory check of the prefill and
// decode programs of every device together, before either is allocated:
// each cluster, loaded on its own, could check only its own.
func (g *genConfig) checkHostMemory(gen *compile.Generation) error {
	var progs []*lower.Program
	var names []string
	for r := range gen.Devices() {
		progs = append(progs, lower.ProgramOf([]*lower.Program{gen.Prefill}, r), lower.ProgramOf([]*lower.Program{gen.Decode}, r))
		names = append(names, fmt.Sprintf("device %d's prefill", r), fmt.Sprintf("device %d's decode", r))
	}
	return cpu.CheckPrograms(progs, names, cpu.Options{MemoryCap: g.MemLimit})
}

// loadGeneration loads the prefill and decode programs on the backend,
// the weights into the prefill program through load, and copies them into
// the decode program. device names the devices; closeAll releases them.
func (g *genConfig) loadGeneration(gen *compile.Generation, load func(weightStore) error) (eng *generate.Engine, device string, closeAll func() error, err error) {
	if g.backend == "cpu" {
		pre, err := cpu.NewCluster(gen.Prefill, cpu.Options{MemoryCap: g.MemLimit})
		if err != nil {
			return nil, "", nil, err
		}
		dec, err := cpu.NewCluster(gen.Decode, cpu.Options{MemoryCap: g.MemLimit})
		if err != nil {
			return nil, "", nil, err
		}
		eng, err := meshEngine(&pre.MeshCluster, &dec.MeshCluster, gen, load)
		return eng, "cpu", func() error { return nil }, err
	}
	// CUDA: one GPU per device (NCCL between them), or every device on
	// one GPU with --pack-gpu, as training places them.
	n := gen.Devices()
	if g.packGPU {
		n = 1
	}
	var rts []*cuda.Runtime
	var closers []func() error
	closeAll = func() error {
		var errs []error
		for i := len(closers) - 1; i >= 0; i-- {
			errs = append(errs, closers[i]())
		}
		return errors.Join(errs...)
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, closeAll())
		}
	}()
	for i := range n {
		rt, err := cuda.Open(cuda.Config{Ordinal: i})
		if err != nil {
			return nil, "", closeAll, err
		}
		rts = append(rts, rt)
		closers = append(closers, rt.Close)
	}
	cluster := func(prog *lower.Program) (*cuda.Cluster, error) {
		progs := []*lower.Program{prog}
		if len(rts) == 1 {
			return cuda.NewPipelineCluster(rts[0], progs, cuda.Options{})
		}
		return cuda.NewNCCLCluster(rts, progs, cuda.Options{})
	}
	pre, err := cluster(gen.Prefill)
	if err != nil {
		return nil, "", closeAll, err
	}
	closers = append(closers, pre.Close)
	dec, err := cluster(gen.Decode)
	if err != nil {
		return nil, "", closeAll, err
	}
	closers = append(closers, dec.Close)
	eng, err = meshEngine(&pre.MeshCluster, &dec.MeshCluster, gen, load)
	return eng, rts[0].Name(), closeAll, err
}

// meshEngine loads the weights into the prefill cluster and makes the
// engine of the two, on either backend.
func meshEngine[D runtime.Member](pre, dec *runtime.MeshCluster[D], gen *compile.Generation, load func(weightStore) error) (*generate.Engine, error) {
	if err := load(pre); err != nil {
		return nil, err
	}
	return generate.NewMeshEngine(pre, dec, gen.Batch, gen.Prompt, gen.Context)
}

// completeRunes drops a UTF-8 sequence cut short at the end of s, which
// the next token completes: a stream prints whole characters.
func completeRunes(s string) string {
	for i := 1; i <= 3 && i <= len(s); i++ {
		c := s[len(s)-i]
		if c < 0x80 {
			return s
		}
		if c >= 0xC0 { // a leading byte: is its sequence whole?
			need := 2
			switch {
			case c >= 0xF0:
				need = 4
			case c >= 0xE0:
				need = 3
			}
			if need > i {
				return s[:len(s)-i]
			}
			return s
		}
	}
	return s
}

// logitsWidth is the vocabulary of p's logits (0 when it has none).
func logitsWidth(p *lower.Program) int {
	id, ok := p.Outputs[ir.OutputLogits]
	if !ok || p.Buffers[id].Global.Rank() != 2 {
		return 0
	}
	return p.Buffers[id].Global.Shape[1]
}

// positionLimit is the rows of the position table the program gathers
// at the positions input (0: none, positions are unbounded).
func positionLimit(p *lower.Program) int {
	id, ok := p.Sources[ir.PositionsInput]
	if !ok {
		return 0
	}
	return p.Buffers[id].Value.Attrs.Int("limit", 0)
}

// sameTokenizer refuses a tokenizer other than the one the checkpoint's
// run trained with, by the data identity its manifest records
// (sameTokenizerAs).
func sameTokenizer(m *checkpoint.Manifest, tok *tokenizer.Tokenizer, flag string) error {
	return sameTokenizerAs(m.Plan.Data, "the checkpoint's run", m.Plan.Tokenizer, tok, flag)
}

// sameTokenizerAs refuses what would read a model's ids as another
// vocabulary's, by the data identity its run recorded (whose: the
// checkpoint's or the weights' run; recorded: the tokenizer files it
// read): a tokenizer other than the one it trained with (of the same
// size it loads, and answers in another tokenizer's text), any tokenizer
// for a run on bytes, and none for a run that trained with one (its ids
// read as bytes, which a --set vocab of its size let through). A run on
// token data without a tokenizer recorded none: any tokenizer passes,
// checked by the vocabulary's size.
func sameTokenizerAs(data, whose string, recorded []string, tok *tokenizer.Tokenizer, flag string) error {
	_, trained, withTokenizer := strings.Cut(data, ";tokenizer ")
	switch {
	case tok != nil && (data == "" || checkpoint.IsTextIdentity(data)):
		return fmt.Errorf("--tokenizer %s: %s trained on bytes, one byte per token: its ids are bytes, which no tokenizer reads (leave --tokenizer out)", flag, whose)
	case tok == nil && withTokenizer:
		give := "give it with --tokenizer"
		if len(recorded) > 0 {
			give = fmt.Sprintf("give it with --tokenizer (the run read %s, which is not there now)", strings.Join(recorded, " with --merges "))
		}
		return fmt.Errorf("%s trained with a tokenizer (fingerprint %.16s): without it the model's ids would be read as bytes; %s", whose, trained, give)
	case tok != nil && withTokenizer && tok.Fingerprint() != trained:
		return fmt.Errorf("--tokenizer %s is not the tokenizer %s trained with (fingerprint %.16s, this one's %.16s): the model's ids would be read as another tokenizer's text; give the run's --tokenizer", flag, whose, trained, tok.Fingerprint())
	}
	return nil
}

// resumedTokenizer is sameTokenizer for the checkpoint --resume names,
// before anything else of it is checked; a checkpoint that does not
// read is left to those checks to name.
func resumedTokenizer(resume string, tok *tokenizer.Tokenizer, flag string) error {
	dir, err := checkpoint.Find(resume)
	if err != nil {
		return nil
	}
	m, err := checkpoint.ReadManifest(dir)
	if err != nil {
		return nil
	}
	return sameTokenizer(m, tok, flag)
}

// loadedTokenizer is sameTokenizer for the --load weights' run: --save
// records the run's data identity in the file's metadata, and export
// the checkpoint's. Weights from elsewhere (Hugging Face's) record none
// and pass.
func loadedTokenizer(file string, tok *tokenizer.Tokenizer, flag string) error {
	if meta := savedMetadata(file); meta != nil {
		return sameTokenizerAs(meta["data"], "the weights' run ("+file+")", recordedFiles(meta), tok, flag)
	}
	return nil
}

// recordedFiles are the tokenizer files --save's metadata records.
func recordedFiles(meta map[string]string) []string {
	var files []string
	for _, k := range []string{"tokenizer", "merges"} {
		if meta[k] != "" {
			files = append(files, meta[k])
		}
	}
	return files
}

// runTokenizer is the tokenizer to read a checkpoint's or weights' model
// with when the command names none (Hugging Face's from_pretrained takes
// the folder's): for a run that trained with one, the files it recorded,
// or those export writes beside weights (tokenizer.json, or GPT-2's
// vocab.json and merges.txt), where they are there now. "" otherwise: a
// run on bytes or on token data without a tokenizer, or files that are
// gone, which sameTokenizerAs then names. The fingerprint check follows
// as for a tokenizer given.
func runTokenizer(resume, load string) (tok, merges string) {
	var data string
	var files []string
	beside := ""
	switch {
	case resume != "":
		dir, err := checkpoint.Find(resume)
		if err != nil {
			return "", ""
		}
		m, err := checkpoint.ReadManifest(dir)
		if err != nil {
			return "", ""
		}
		data, files = m.Plan.Data, m.Plan.Tokenizer
	case load != "":
		meta := savedMetadata(load)
		if meta == nil {
			return "", ""
		}
		data, files, beside = meta["data"], recordedFiles(meta), filepath.Dir(load)
	}
	if !strings.Contains(data, ";tokenizer ") {
		return "", ""
	}
	if len(files) > 0 && !slices.ContainsFunc(files, func(f string) bool { return !isRegularFile(f) && !isFolder(f) }) {
		if len(files) == 1 {
			return files[0], ""
		}
		return files[0], files[1]
	}
	if beside != "" {
		return tokenizerBeside(beside)
	}
	return "", ""
}

// tokenizerBeside is the tokenizer export writes in dir beside the
// weights, as Hugging Face's folders hold it: its tokenizer.json, or
// GPT-2's vocab.json and merges.txt; "" when neither is there.
func tokenizerBeside(dir string) (tok, merges string) {
	if t := filepath.Join(dir, "tokenizer.json"); isRegularFile(t) {
		return t, ""
	}
	if v, m := filepath.Join(dir, "vocab.json"), filepath.Join(dir, "merges.txt"); isRegularFile(v) && isRegularFile(m) {
		return v, m
	}
	return "", ""
}

// tokenizerNote says that the run's tokenizer is read (runTokenizer),
// found where.
func tokenizerNote(tok, merges, where string) string {
	if merges != "" {
		tok += " --merges " + merges
	}
	return fmt.Sprintf("note: --tokenizer %s: the tokenizer the run trained with, %s", tok, where)
}

// defaultTokenizer sets *tok and *merges to the run's (runTokenizer)
// when neither was given, and returns the note that says so ("" when
// nothing was set).
func defaultTokenizer(tok, merges *string, resume, load string) string {
	if *tok != "" || *merges != "" {
		return ""
	}
	if *tok, *merges = runTokenizer(resume, load); *tok == "" {
		return ""
	}
	where := "recorded in the checkpoint"
	if resume == "" {
		where = "recorded in the weights' file"
		if filepath.Dir(*tok) == filepath.Dir(load) {
			where = "beside the weights"
		}
	}
	return tokenizerNote(*tok, *merges, where)
}

// isFolder says whether path names a folder (after links).
func isFolder(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.IsDir()
}

// savedMetadata is the metadata of a safetensors file gcompile's --save
// wrote (the run's model, --set, data identity, batch), nil for any
// other file: weights from elsewhere, or a file that does not read,
// which the load names.
func savedMetadata(file string) map[string]string {
	if strings.HasSuffix(file, ".index.json") {
		// Export's shards each carry the metadata: the first one's.
		files := checkpoint.IndexedFiles(file)
		if len(files) < 2 {
			return nil
		}
		file = files[1]
	}
	if !strings.HasSuffix(file, ".safetensors") {
		return nil
	}
	f, err := checkpoint.Open(file)
	if err != nil {
		return nil
	}
	defer f.Close()
	if f.Metadata["producer"] != "gcompile" {
		return nil
	}
	return f.Metadata
}

// checkpointModel refuses a checkpoint of another model before its
// weights are read: one whose params have this model's shapes but not its
// maths (other heads, another activation, another rotary base) would load
// and give wrong figures without a word. The model is built at the
// checkpoint's batch (unless the caller's build, fingerprint, already is)
// and its fingerprint compared with the manifest's, as a resumed training
// run compares it; a --set that changes only the loss (sameLogits) is
// the same model here. It returns the manifest it read.
func checkpointModel(cfg compile.Config, resume, fingerprint string) (*checkpoint.Manifest, error) {
	dir, err := checkpoint.Find(resume)
	if err != nil {
		return nil, fmt.Errorf("--resume: %w", err)
	}
	m, err := checkpoint.ReadManifest(dir)
	if err != nil {
		return nil, fmt.Errorf("--resume: %w", err)
	}
	if m.ModelFingerprint == "" || m.Plan.DPSync == "async" || m.Plan.Batch <= 0 || !strings.HasSuffix(cfg.Model, ".go") {
		return m, nil // an older checkpoint, a replica's model, or a .gir's fixed one: the shapes are checked on load
	}
	var mod *ir.Module
	build := func() error {
		cfg.Batch, cfg.DPSync = m.Plan.Batch, "sync"
		mod, err = compile.LoadModule(&cfg)
		return err
	}
	if fingerprint == "" || cfg.Batch != m.Plan.Batch {
		if err := build(); err != nil {
			return nil, err
		}
		fingerprint = mod.Fingerprint()
	}
	if fingerprint == m.ModelFingerprint {
		return m, nil
	}
	if mod == nil {
		if err := build(); err != nil {
			return nil, err
		}
	}
	set, _ := m.Plan.Flags["set"].(string)
	if sameLogits(cfg, set, m.ModelFingerprint, mod) {
		return m, nil
	}
	if _, ok := implementationOnly(cfg, set, m.ModelFingerprint); ok {
		return m, nil
	}
	return nil, anotherModel("--resume "+dir, "the checkpoint is", cfg, m.Model, set, m.ModelFingerprint, fingerprint, m.Plan.Data)
}

// sameLogits reports whether weights of cfg's model file trained with
// --set set (whose module, at cfg's batch, had the fingerprint was)
// compute the same logits in now, the model built with cfg's --set: the
// settings differ only in what the loss adds to the cross-entropy (a
// MoE's aux weight), which evaluation and generation leave out. A --set
// this model file does not build, or builds into another fingerprint, is
// another model (or the file has changed).
func sameLogits(cfg compile.Config, set, was string, now *ir.Module) bool {
	cfg.Set = set
	trained, err := compile.LoadModule(&cfg)
	return err == nil && trained.Fingerprint() == was && trained.ForwardFingerprint() == now.ForwardFingerprint()
}

// implementationOnly reports whether weights of cfg's model file trained
// with --set set (whose module, at cfg's batch, had the fingerprint was)
// are of cfg's model computed another way: the two --set lists differ
// only in parameters the model reads with Builder.Implementation (a fused
// attention op or the primitive ops it stands for), and the model file,
// built with set, still gives was. It says which (as "attention=fused,
// here unfused").
func implementationOnly(cfg compile.Config, set, was string) (string, bool) {
	if !strings.HasSuffix(cfg.Model, ".go") {
		return "", false
	}
	then, err1 := frontend.ParseSet(set)
	now, err2 := frontend.ParseSet(cfg.Set)
	if err1 != nil || err2 != nil {
		return "", false
	}
	docs, err := (&loader.Loader{Timeout: cfg.ModelTimeout, Context: cfg.Interrupt}).Describe(cfg.Model, frontend.Config{Batch: cfg.Batch, Set: now})
	if err != nil {
		return "", false
	}
	var differ []string
	for _, d := range docs {
		a, ok := then[d.Key]
		if !ok {
			a = d.Default
		}
		b, ok := now[d.Key]
		if !ok {
			b = d.Default
		}
		if a == b {
			continue
		}
		if !d.Implementation {
			return "", false
		}
		differ = append(differ, fmt.Sprintf("%s=%s, here %s", d.Key, a, b))
	}
	for k := range then {
		if !slices.ContainsFunc(docs, func(d frontend.ParamDoc) bool { return d.Key == k }) {
			return "", false // a key this build does not read: another model
		}
	}
	if len(differ) == 0 {
		return "", false // the same settings: the model file has changed
	}
	cfg.Set = set
	trained, err := compile.LoadModule(&cfg)
	if err != nil || trained.Fingerprint() != was {
		return "", false
	}
	return strings.Join(differ, "; "), true
}

// anotherModel is the error of weights (from: the flag and its path;
// what: "the checkpoint is", "the weights are") trained as model with
// --set set and fingerprint was, read by cfg's model, whose fingerprint
// is now; data is the run's data identity ("" unknown), whose vocabulary
// a --set vocab would not reproduce.
func anotherModel(from, what string, cfg compile.Config, model, set, was, now, data string) error {
	return fmt.Errorf("%s: %w", anotherModelText(from, what, cfg, model, set, was, now, data), checkpoint.ErrMismatch)
}

// anotherModelText is anotherModel's message.
func anotherModelText(from, what string, cfg compile.Config, model, set, was, now, data string) string {
	if name := cfg.ModelName(); model != "" && !strings.HasSuffix(cfg.Model, ".gir") && name != model {
		// The name is part of the model: a model.go copied to another
		// folder builds another model, whatever its code. Whether that
		// is all is not known here, so both are said.
		return fmt.Sprintf("%s: %s of model %q (fingerprint %.12s), and %s builds model %q (fingerprint %.12s): another model, or the weights' model file in a folder of another name (a model.go's model is named by its folder, and the name is part of what a checkpoint holds: run it from a folder named %q)",
			from, what, model, was, cfg.Model, name, now, model)
	}
	hint := "give the --set it was trained with"
	if v, ok := setValue(set, "vocab"); ok && data != "" && !checkpoint.IsTextIdentity(data) {
		if cur, _ := setValue(cfg.Set, "vocab"); cur != v {
			// The vocabulary came from the run's token data: setting it
			// by hand would evaluate the model on other tokens.
			hint = fmt.Sprintf("its vocab=%s came from the token data it trained on: give the run's --tokenizer (eval: and its --data PREFIX and --split), not --set vocab", v)
		}
	}
	if _, had := setValue(set, "vocab"); !had && (data == "" || checkpoint.IsTextIdentity(data)) {
		if v, ok := setValue(cfg.Set, "vocab"); ok {
			// A byte-level run read with a tokenizer or token data, whose
			// vocabulary this run added to the --set: not other maths on
			// the same shapes, but another vocabulary.
			return fmt.Sprintf("%s: %s of model %q trained on bytes (256 classes) with --set %q (fingerprint %.12s); this run has vocab=%s (from --tokenizer, token --data or --set vocab), another vocabulary: leave those out to read it as it trained",
				from, what, model, set, was, v)
		}
	}
	if set == cfg.Set {
		// The sizes agree: the model file is another (or has changed),
		// or the classes differ, which a run's tokenizer sets.
		fix := fmt.Sprintf("give the model file %s was trained with", strings.TrimSuffix(strings.TrimSuffix(what, " is"), " are"))
		if strings.Contains(data, ";tokenizer ") {
			fix = "its run read its data with a tokenizer, whose vocabulary sets the model's classes: without that --tokenizer (and --data PREFIX) as the run gave them, the classes differ; with them, " + fix
		}
		return fmt.Sprintf("%s: %s of model %q (fingerprint %.12s), and %s with the same --set %q is another model (fingerprint %.12s): %s",
			from, what, model, was, cfg.Model, set, now, fix)
	}
	return fmt.Sprintf("%s: %s of model %q trained with --set %q (fingerprint %.12s); with --set %q this model is another (fingerprint %.12s): the same param shapes can hold other maths (heads, activation, rotary base), so %s",
		from, what, model, set, was, cfg.Set, now, hint)
}

// paddedAlike says whether two --set lists differ in vocab alone, each a
// padding of the data's classes (at least as many).
func paddedAlike(a, b string, classes int) bool {
	x, errA := frontend.ParseSet(a)
	y, errB := frontend.ParseSet(b)
	if errA != nil || errB != nil || len(x) != len(y) {
		return false
	}
	for k, v := range x {
		w, ok := y[k]
		switch {
		case !ok:
			return false
		case k == "vocab":
			n, errN := strconv.Atoi(v)
			m, errM := strconv.Atoi(w)
			if errN != nil || errM != nil || n < classes || m < classes {
				return false
			}
		case v != w:
			return false
		}
	}
	return true
}

// loadsIfTheyFit ends savedModel's note of weights that loaded.
const loadsIfTheyFit = "; they load if their shapes fit, and compute what this model computes"

// savedModel compares weights that gcompile's --save wrote (its metadata
// names the model, its --set, the fingerprint of the model it trained and
// the batch that model was built at) with cfg's model built at that batch,
// and returns a note when they differ: the same param shapes can hold
// other maths (heads, activation, rotary base). Only a note, since a
// loss-only setting (a MoE's aux weight) also changes the fingerprint and
// evaluating with it changed is what a user may want. Weights from
// elsewhere, an export, another model's (their names say so on load) or
// a .gir model's get no note.
func savedModel(cfg compile.Config, file string) (string, error) {
	meta := savedMetadata(file)
	if !strings.HasSuffix(cfg.Model, ".go") || meta == nil {
		return "", nil
	}
	batch, err := strconv.Atoi(meta["batch"])
	if meta["model_fingerprint"] == "" || err != nil || batch < 1 {
		return "", nil
	}
	cfg.Batch, cfg.DPSync = batch, "sync"
	mod, err := compile.LoadModule(&cfg)
	if err != nil {
		return "", err
	}
	if cfg.Classes > 0 && paddedAlike(meta["set"], cfg.Set, cfg.Classes) {
		// --save wrote the tables at the data's classes, which load into
		// any padding of them: another tp pads them otherwise.
		return "", nil
	}
	if now := mod.Fingerprint(); mod.Name == meta["model"] && now != meta["model_fingerprint"] && !sameLogits(cfg, meta["set"], meta["model_fingerprint"], mod) {
		if _, ok := implementationOnly(cfg, meta["set"], meta["model_fingerprint"]); ok {
			return "", nil
		}
		return "note: " + anotherModelText("--load "+file, "the weights are", cfg, meta["model"], meta["set"], meta["model_fingerprint"], now, meta["data"]) +
			loadsIfTheyFit, nil
	}
	return "", nil
}

// loadCheckpointParams loads the params of a training checkpoint.
func loadCheckpointParams(dev weightStore, progs []*lower.Program, path string, ignore []string, classes int) error {
	dir, err := checkpoint.Find(path)
	if err != nil {
		return fmt.Errorf("--resume: %w", err)
	}
	m, ts, err := checkpoint.Consolidate(dir, lower.Param)
	if err != nil {
		return fmt.Errorf("--resume: %w", err)
	}
	warnDamagedState("--resume", dir, m)
	return loadTensors(dev, progs, ts, "--resume "+dir, ignore, classes)
}

// lossy is s with each maximal ill-formed part of its UTF-8 (a sequence
// cut short, a stray continuation byte) as one U+FFFD, as Unicode
// recommends and Hugging Face's decode (Rust's from_utf8_lossy, Python's
// errors="replace") gives it. encoding/json would write one for each
// byte: a character cut after two of its three bytes showed as two.
func lossy(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r != utf8.RuneError || size > 1 {
			b.WriteString(s[i : i+size])
			i += size
			continue
		}
		b.WriteRune(utf8.RuneError)
		i += maximalSubpart(s[i:])
	}
	return b.String()
}

// maximalSubpart is the length of the ill-formed part that starts p: its
// lead byte and the continuation bytes that could still have followed it.
func maximalSubpart(p string) int {
	c := p[0]
	lo, hi, total := byte(0x80), byte(0xBF), 0
	switch {
	case c >= 0xC2 && c <= 0xDF:
		total = 2
	case c == 0xE0:
		lo, total = 0xA0, 3
	case c == 0xED:
		hi, total = 0x9F, 3
	case c >= 0xE1 && c <= 0xEF:
		total = 3
	case c == 0xF0:
		lo, total = 0x90, 4
	case c == 0xF4:
		hi, total = 0x8F, 4
	case c >= 0xF1 && c <= 0xF3:
		total = 4
	default:
		return 1
	}
	n := 1
	for n < total && n < len(p) {
		x := p[n]
		if n == 1 && (x < lo || x > hi) || n > 1 && (x < 0x80 || x > 0xBF) {
			break
		}
		n++
	}
	return n
}

// positionsFit refuses a context past the model's position table.
func positionsFit(gen *compile.Generation, g *genConfig, context, need, longest int) error {
	if limit := positionLimit(gen.Decode); limit > 0 && context > limit {
		if g.context > need {
			// The cache asked for, not the prompts, is past the table.
			return fmt.Errorf("--context %d: past the model's position table of %d rows (the prompts and --max-new-tokens need %d positions; leave --context out for that many)", g.context, limit, need)
		}
		fix := "shorten the prompts"
		if fits := limit - longest + 1; fits >= 1 {
			fix = fmt.Sprintf("--max-new-tokens %d or fewer fits", fits)
		}
		return fmt.Errorf("%w: %d positions (the longest prompt, %d tokens, plus --max-new-tokens %d less the last, which is not fed back) are past the model's position table of %d rows: %s", generate.ErrBadPrompt, context, longest, g.maxNew, limit, fix)
	}
	return nil
}
