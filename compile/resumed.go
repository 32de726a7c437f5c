package compile

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"gcompile/frontend"
	"gcompile/ir"
)

// checkResumed checks that c describes the plan a module read from a .gir
// dump was compiled for, as far as the passes the dump went through fixed
// it: the pipeline's stages and chunks (pipeline-split), the microbatches
// (microbatch), the precision (mixed-precision) and the device mesh
// (shard). The remaining passes run for c's plan, so a dump of one plan
// resumed under another would lower to programs that disagree with the
// graph (a panic, or transfers that do not pair up) or silently train the
// dump's plan instead of the one asked for.
func checkResumed(c *Config, m *ir.Module) error {
	type fact struct{ what, dump, asked, flags string }
	var wrong []fact
	var pass string
	if m.HasRun("pipeline-split") {
		pass = "pipeline-split"
		// A value's stage is its global chunk, p·v of them, chunk j on
		// pipeline rank j mod p: the dump fixes the number of chunks, and
		// any pp·vpp that makes it lowers it (the mesh, once the shard
		// pass ran, fixes pp itself). Counting the chunks as stages had
		// refused every interleaved dump.
		stages := map[int]bool{}
		for _, v := range m.Values {
			if v.Meta.Stage >= 0 {
				stages[v.Meta.Stage] = true
			}
		}
		chunks := max(len(stages), 1)
		if asked := max(c.PP, 1) * max(c.VPP, 1); chunks != asked {
			flags := fmt.Sprintf("--pp %d", chunks)
			if pp := meshSize(m.Mesh, "pp"); pp > 0 && chunks%pp == 0 {
				flags = fmt.Sprintf("--pp %d --vpp %d", pp, chunks/pp)
			}
			wrong = append(wrong, fact{"pipeline chunks (pp·vpp)", fmt.Sprint(chunks), fmt.Sprint(asked), flags})
		}
	}
	if m.HasRun("microbatch") {
		pass = "microbatch"
		micro := 0
		for _, v := range m.Values {
			micro = max(micro, v.Meta.Micro+1)
		}
		micro = max(micro, 1)
		if micro != max(c.Microbatches, 1) {
			wrong = append(wrong, fact{"microbatches", fmt.Sprint(micro), fmt.Sprint(max(c.Microbatches, 1)), fmt.Sprintf("--microbatches %d", micro)})
		}
	}
	if m.HasRun("mixed-precision") {
		pass = "mixed-precision"
		precision := "fp32"
		if m.Source(ir.InputLossScale) != nil {
			precision = "bf16"
			for _, v := range m.Values {
				if v.Type.DType == ir.F16 {
					precision = "fp16"
					break
				}
			}
		}
		if asked := orDefault(c.Precision, "fp32"); precision != asked {
			wrong = append(wrong, fact{"precision", precision, asked, "--precision " + precision})
		}
	}
	if m.HasRun("shard") && c.DPSync == "async" && m.Mesh != nil && len(m.Mesh.Axes) > 0 {
		// Its flags are this run's: the conflict is async itself, whose
		// replicas are whole single-device programs.
		return fmt.Errorf("%s went through pass \"shard\" for %d devices (%s), and --dp-sync async runs whole single-device replicas, which a sharded program is not: train it synchronously, or start from a dump made before the shard pass (its 00-input.gir)",
			c.Model, m.Mesh.Devices(), m.Mesh)
	}
	if m.HasRun("shard") {
		pass = "shard"
		dump, asked := "one device", "one device"
		if m.Mesh != nil && len(m.Mesh.Axes) > 0 {
			dump = fmt.Sprintf("%d devices (%s)", m.Mesh.Devices(), m.Mesh)
		}
		if mesh := c.PassOptions().Mesh; mesh != nil && len(mesh.Axes) > 0 {
			asked = fmt.Sprintf("%d devices (%s)", mesh.Devices(), mesh)
		}
		if dump != asked {
			wrong = append(wrong, fact{"the mesh", dump, asked, meshFlags(m.Mesh)})
		}
	}
	// Flags read only by a pass the dump already went through would be
	// ignored without a word: the optimizer's update, say, is in the dump.
	var ignored []string
	for _, pf := range passFlags {
		if m.HasRun(pf.pass) {
			for _, f := range pf.flags {
				if c.Explicit[f] {
					ignored = append(ignored, fmt.Sprintf("--%s (pass %q)", f, pf.pass))
				}
			}
		}
	}
	if len(ignored) > 0 {
		return fmt.Errorf("%s went through the passes that read %s: the dump has them applied, so they would change nothing; leave them out, or start from its 00-input.gir",
			c.Model, strings.Join(ignored, ", "))
	}
	if len(wrong) == 0 {
		return nil
	}
	var diffs, flags []string
	for _, w := range wrong {
		diffs = append(diffs, fmt.Sprintf("%s: %s in the dump, %s in this run", w.what, w.dump, w.asked))
		for _, f := range strings.Split(w.flags, " --") {
			if f = "--" + strings.TrimPrefix(f, "--"); !slices.Contains(flags, f) {
				flags = append(flags, f)
			}
		}
	}
	return fmt.Errorf("%s went through pass %q for another plan (%s): the passes it went through keep their plan; run it with %s, or start from its 00-input.gir to compile for this one",
		c.Model, pass, strings.Join(diffs, "; "), strings.Join(flags, " "))
}

// passFlags are the flags only one pass reads (the plan's axes, which
// several read, are compared with the dump's instead).
var passFlags = []struct {
	pass  string
	flags []string
}{
	{"optimizer", []string{"optimizer", "beta1", "beta2", "weight-decay", "clip"}},
	{"recompute", []string{"recompute"}},
	{"compress", []string{"compress-activations"}},
	{"shard", []string{"zero", "sequence-parallel"}},
	{"fuse", []string{"fuse"}},
	{"data-parallel", []string{"bucket-mb", "grad-reduce-dtype"}},
}

// checkGir checks what a .gir dump says beyond its syntax, which a hand
// edit can break and which the passes it already went through would not
// check again: the graph's types and shapes (ir.Verify, for a dump past
// verify-input), every param's and state's init, ids the passes can add
// to, and, past the optimizer, that every param is updated with sane
// hyperparameters.
func checkGir(m *ir.Module) error {
	// A dump the verify-input pass has not checked yet is verified by it.
	if m.HasRun("verify-input") {
		if err := ir.Verify(m, ""); err != nil {
			return err
		}
	}
	if m.NextID() > maxGirID {
		return fmt.Errorf("%s: value ids up to %d: the ids the passes add after them would overflow (gcompile numbers values from 0)", m.Name, m.NextID()-1)
	}
	updated := map[*ir.Value]bool{}
	for _, u := range m.Updates {
		updated[u.State] = true
	}
	for _, v := range m.Values {
		switch v.Op {
		case "param", "state":
			init := v.Attrs.Str("init")
			if from, ok := strings.CutPrefix(init, ir.InitCopyPrefix); ok && v.Op == "state" {
				if from == "" {
					return fmt.Errorf("%s: state %q: init %q names no param to copy", v.Where(), v.Name(), init)
				}
			} else if _, _, err := ir.ParseInit(init); err != nil {
				return fmt.Errorf("%s: %s %q: %w", v.Where(), v.Op, v.Name(), err)
			}
			if v.Op == "param" {
				// A name the weights files cannot hold would fail the
				// save after training; the DSL refuses it at its line.
				if err := ir.CheckParamName(v.Name()); err != nil {
					return fmt.Errorf("%s: %w", v.Where(), err)
				}
				// Checked on one device too, as the model's line is: the
				// shard pass reads it only when a plan splits over tp.
				if err := frontend.CheckParallelHint(v.Attrs.Str("parallel"), v.Type.Shape); err != nil {
					return fmt.Errorf("%s: param %q: %w", v.Where(), v.Name(), err)
				}
			}
			if v.Op == "param" && m.HasRun("optimizer") && !updated[v] {
				return fmt.Errorf("%s: param %q has no update, though the dump went through the optimizer: it would stay at its initial value (an update line was removed?)", v.Where(), v.Name())
			}
		}
		for _, k := range []string{"beta1", "beta2"} {
			if b, ok := v.Attrs[k].(float64); ok && !(b >= 0 && b < 1) {
				return fmt.Errorf("%s: %s=%g: an exponential moving average's decay is in [0, 1)", v.Where(), k, b)
			}
		}
		if e, ok := v.Attrs["eps"].(float64); ok && v.Op == "adamw" && !(e > 0 && !math.IsInf(e, 0)) {
			return fmt.Errorf("%s: eps=%g: want a positive number", v.Where(), e)
		}
		if wd, ok := v.Attrs["wd"].(float64); ok && !(wd >= 0 && !math.IsInf(wd, 0)) {
			return fmt.Errorf("%s: wd=%g: weight decay is a finite number ≥ 0", v.Where(), wd)
		}
		// As --clip: a negative norm turns the update into ascent, NaN
		// makes every weight NaN.
		if n, ok := v.Attrs["max_norm"].(float64); ok && v.Op == "clip_coef" && !(n > 0 && !math.IsInf(n, 0)) {
			return fmt.Errorf("%s: max_norm=%g: the gradient's clipping norm is a finite number > 0", v.Where(), n)
		}
	}
	return nil
}

// maxGirID bounds a .gir's value ids: far more values than any model has,
// and the passes' new ids after the largest stay far from overflow.
const maxGirID = 1 << 40

// meshFlags are the flags that give mesh.
func meshFlags(mesh *ir.Mesh) string {
	if mesh == nil || len(mesh.Axes) == 0 {
		return "--devices 1"
	}
	flags := []string{fmt.Sprintf("--devices %d", mesh.Devices())}
	for _, a := range mesh.Axes {
		flags = append(flags, fmt.Sprintf("--%s %d", a.Name, a.Size))
	}
	return strings.Join(flags, " ")
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// meshSize is the size of mesh m's axis name, 0 without one.
func meshSize(m *ir.Mesh, name string) int {
	if m == nil {
		return 0
	}
	for _, a := range m.Axes {
		if a.Name == name {
			return a.Size
		}
	}
	return 0
}
