package planner

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"gcompile/compile"
	"gcompile/cost"
	"gcompile/internal/jsonerr"
	"gcompile/passes"
)

// MeasuredPlan is a plan that ran, with its measured step time: the plan
// fields of a --plan --metrics row (Row) and step_ms.
type MeasuredPlan struct {
	PlanFields
	StepMs float64 `json:"step_ms"`
	// Batch, from a run's metrics, is the batch it ran (0: the row's or
	// the command line's).
	Batch int `json:"batch,omitempty"`
	// Run is what a run's metrics say of the model it trained, which the
	// model being calibrated must match (nil for a plan of a list).
	Run *MeasuredRun `json:"-"`
}

// MeasuredRun is the model a run's --metrics says it trained, or a
// --plan --metrics table says its plans are of (Table).
type MeasuredRun struct {
	Params    int64
	Precision string
	// Set is the run's --set (config.set).
	Set   string
	Table bool
}

// Check refuses a run's metrics whose model is not the one given here:
// other parameters, another --set (a sequence length or an attention
// core changes the step, not always the parameters) or another
// precision ran another program, and its time says nothing of this
// one's.
func (r *MeasuredRun) Check(params int64, precision, set string) error {
	if r == nil {
		return nil
	}
	// A run's metrics say what it trained; a table, what its plans are of.
	what, madeOf, ranIn := "the run", "trained", "trained"
	if r.Table {
		what, madeOf, ranIn = "the table's plans", "are of", "are"
	}
	if r.Params > 0 && r.Params != params {
		return fmt.Errorf("%s %s a model of %d parameters, and the model given here has %d: calibrate with the model (and --set) that ran", what, madeOf, r.Params, params)
	}
	// A table's plans are checked by their model's size and precision
	// alone: its --set as typed says too little (a default given or
	// not, a .gir that has none) to refuse by.
	if diff := setDiff(r.Set, set); diff != "" && !r.Table {
		return fmt.Errorf("the run's --set differs from this command's (%s): calibrate with the --set that ran, %q", diff, r.Set)
	}
	if precision == "" {
		precision = "fp32"
	}
	if r.Precision != "" && r.Precision != precision {
		return fmt.Errorf("%s %s in %s, and this command prices %s: give --precision %s", what, ranIn, r.Precision, precision, r.Precision)
	}
	return nil
}

// ReadMeasured reads measured plans from a JSON file: a list of
// MeasuredPlan, an object whose "plans" are (--plan --metrics' schema
// with step_ms added to each row), or the --metrics file of a training
// run (its plan from "config", its step time the median of its steps
// after the first, which warms up). A plan entry may carry the other
// fields of a --plan --metrics row, which are ignored; any other key is
// an error, since a misspelt axis would otherwise calibrate a plan that
// did not run.
func ReadMeasured(path string) ([]MeasuredPlan, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	const want = `want a list of measured plans, {"plans": [...]} or a run's --metrics`
	trimmed := bytes.TrimLeft(raw, " \t\r\n") // JSON's white space
	switch {
	case bytes.HasPrefix(trimmed, []byte("[")):
		var entries []json.RawMessage
		if err := json.Unmarshal(raw, &entries); err != nil {
			return nil, fmt.Errorf("%s: %w", path, jsonerr.Decode(raw, err))
		}
		return readEntries(path, entries)
	case bytes.HasPrefix(trimmed, []byte("{")):
	case len(trimmed) == 0 || bytes.HasPrefix(raw, []byte("\xef\xbb\xbf")):
		// Empty, or a byte-order mark: said as the other JSON inputs say it.
		var v any
		return nil, fmt.Errorf("%s: %w", path, jsonerr.Decode(raw, json.Unmarshal(raw, &v)))
	default:
		return nil, fmt.Errorf("%s: not a JSON list or object (%s)", path, want)
	}
	var obj struct {
		Plans     []json.RawMessage `json:"plans"`
		Precision *string           `json:"precision"`
		Set       string            `json:"set"`
		Config    json.RawMessage   `json:"config"`
		Steps     []struct {
			Ms *float64 `json:"ms"`
		} `json:"steps"`
		Carried int `json:"carried_steps"`
		Model   struct {
			Params int64 `json:"params"`
		} `json:"model"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil {
		return nil, fmt.Errorf("%s: %s: %w", path, want, jsonerr.Decode(raw, err))
	}
	switch {
	case obj.Plans != nil:
		ps, err := readEntries(path, obj.Plans)
		if err == nil && obj.Precision != nil {
			// A --plan --metrics table says what model its plans are of.
			run := &MeasuredRun{Params: obj.Model.Params, Precision: *obj.Precision, Set: obj.Set, Table: true}
			for i := range ps {
				ps[i].Run = run
			}
		}
		return ps, err
	case obj.Config != nil:
		// Steps carried from a resumed run's earlier parts ran in other
		// processes, perhaps under another plan: only the last part's
		// are of the config given.
		if obj.Carried < 0 || obj.Carried > len(obj.Steps) {
			return nil, fmt.Errorf("%s: carried_steps %d of %d steps", path, obj.Carried, len(obj.Steps))
		}
		obj.Steps = obj.Steps[obj.Carried:]
		if len(obj.Steps) < 2 {
			return nil, fmt.Errorf("%s: a run's metrics with %d steps of its config's plan: at least 2 are needed (the first warms up)", path, len(obj.Steps))
		}
		var cfg map[string]json.RawMessage
		if err := json.Unmarshal(obj.Config, &cfg); err != nil {
			return nil, fmt.Errorf("%s: %w", path, keyOfType("config", "a JSON object", err))
		}
		for _, k := range []string{"tp", "pp", "dp"} {
			if _, ok := cfg[k]; !ok {
				return nil, fmt.Errorf("%s: a run's metrics whose config gives no %s: not a --metrics file of gcompile's, or one cut short", path, k)
			}
		}
		var p MeasuredPlan
		if err := json.Unmarshal(obj.Config, &p); err != nil {
			return nil, fmt.Errorf("%s: config: %w", path, jsonerr.Value(err))
		}
		var precision string
		if raw, ok := cfg["precision"]; ok {
			if err := json.Unmarshal(raw, &precision); err != nil {
				return nil, fmt.Errorf("%s: %w", path, keyOfType("config.precision", "a string", err))
			}
		}
		var set string
		if raw, ok := cfg["set"]; ok {
			if err := json.Unmarshal(raw, &set); err != nil {
				return nil, fmt.Errorf("%s: %w", path, keyOfType("config.set", "a string", err))
			}
		}
		p.Run = &MeasuredRun{Params: obj.Model.Params, Precision: precision, Set: set}
		ms := make([]float64, 0, len(obj.Steps)-1)
		for i, s := range obj.Steps[1:] {
			if s.Ms == nil {
				return nil, fmt.Errorf("%s: steps[%d] has no ms (each step's time in milliseconds, as gcompile's --metrics writes it)", path, i+1)
			}
			if !(*s.Ms > 0) {
				// Named by the run's key, not the step_ms its median becomes.
				return nil, fmt.Errorf("%s: steps[%d].ms must be a positive time, got %g", path, i+1, *s.Ms)
			}
			ms = append(ms, *s.Ms)
		}
		slices.Sort(ms)
		p.StepMs = ms[len(ms)/2]
		return checkMeasured(path, []MeasuredPlan{p}, []int{1})
	}
	return nil, fmt.Errorf("%s: no measured plans (%s)", path, want)
}

// entryKeys are the keys a plan entry may have: MeasuredPlan's and a
// --plan --metrics row's.
var entryKeys = jsonKeys(reflect.TypeFor[MeasuredPlan](), reflect.TypeFor[Row]())

// planKeys are the keys that say something of a measured row's plan
// (PlanFields' and batch): a row with none of them is a time alone.
var planKeys = jsonKeys(reflect.TypeFor[PlanFields](), reflect.TypeFor[struct {
	Batch int `json:"batch"`
}]())

// jsonKeys are the JSON keys of the types' fields, embedded ones' too.
func jsonKeys(types ...reflect.Type) map[string]bool {
	keys := map[string]bool{}
	var walk func(reflect.Type)
	walk = func(t reflect.Type) {
		for f := range t.Fields() {
			if f.Anonymous {
				walk(f.Type)
				continue
			}
			if name, _, _ := strings.Cut(f.Tag.Get("json"), ","); name != "" && name != "-" {
				keys[name] = true
			}
		}
	}
	for _, t := range types {
		walk(t)
	}
	return keys
}

// readEntries decodes each plan entry on its own, so that an error names
// the entry. An entry without a step_ms is a plan not run (the other rows
// of a --plan --metrics table) and is left out; a step_ms that is there
// must be a time.
func readEntries(path string, entries []json.RawMessage) ([]MeasuredPlan, error) {
	ps := make([]MeasuredPlan, 0, len(entries))
	var nums []int // each kept plan's number in the file
	for i, e := range entries {
		var keys map[string]json.RawMessage
		if err := json.Unmarshal(e, &keys); err != nil {
			shown := string(e)
			if len(shown) > 40 {
				shown = shown[:40] + "…"
			}
			return nil, fmt.Errorf("%s: plan %d: not a JSON object but %s", path, i+1, shown)
		}
		planned := false // some key says what plan ran
		for _, k := range slices.Sorted(maps.Keys(keys)) {
			planned = planned || planKeys[k]
			if !entryKeys[k] {
				return nil, fmt.Errorf("%s: plan %d: unknown key %q (a plan gives tp, pp, dp, ep, cp, cp_impl, cp_layout, vpp, microbatch_size, microbatches, zero, sequence_parallel, recompute, offload, schedule, overlap_grad_reduce, batch and step_ms)", path, i+1, k)
			}
		}
		if k := repeatedKey(e); k != "" {
			return nil, fmt.Errorf("%s: plan %d: key %q given twice (JSON would keep the last, silently)", path, i+1, k)
		}
		var p MeasuredPlan
		if err := json.Unmarshal(e, &p); err != nil {
			return nil, fmt.Errorf("%s: plan %d: %w", path, i+1, jsonerr.Value(err))
		}
		raw, ok := keys["step_ms"]
		if !ok {
			continue
		}
		if !planned {
			return nil, fmt.Errorf("%s: plan %d: a step_ms with no plan: give the tp, pp and dp it ran with (1, 1, 1 on one device)", path, i+1)
		}
		if raw, ok := keys["plan"]; ok {
			// A table's row names its plan: an axis its fields leave out
			// (taken as 1) or give otherwise would calibrate another plan
			// than ran, without a word.
			if err := planAgrees(raw, p.PlanFields); err != nil {
				return nil, fmt.Errorf("%s: plan %d: %w", path, i+1, err)
			}
		}
		if string(bytes.TrimSpace(raw)) == "null" {
			return nil, fmt.Errorf("%s: plan %d: step_ms is null: give the step time you measured, in milliseconds", path, i+1)
		}
		ps = append(ps, p)
		nums = append(nums, i+1)
	}
	if len(entries) > 0 && len(ps) == 0 {
		return nil, fmt.Errorf("%s: no plan in it has a step_ms: add the step time you measured, in milliseconds, to each plan you ran", path)
	}
	return checkMeasured(path, ps, nums)
}

// planAxis is one axis of a plan's description ("tp=2 pp=4 dp=8 …").
var planAxis = regexp.MustCompile(`\b(tp|pp|dp|ep|cp)=(\d+)\b`)

// planAgrees refuses a row whose "plan" (as the table describes it)
// names another degree of an axis than the row's own field: an edited
// row whose description and fields disagree is not a plan that ran.
func planAgrees(raw json.RawMessage, f PlanFields) error {
	var desc string
	if json.Unmarshal(raw, &desc) != nil {
		return nil // not the table's string: the fields say the plan
	}
	fields := map[string]int{"tp": max(f.TP, 1), "pp": max(f.PP, 1), "dp": max(f.DP, 1), "ep": max(f.EP, 1), "cp": max(f.CP, 1)}
	for _, m := range planAxis.FindAllStringSubmatch(desc, -1) {
		if n, _ := strconv.Atoi(m[2]); n != fields[m[1]] {
			return fmt.Errorf("its plan %q says %s=%d and its %s field %d: give the fields of the plan that ran", desc, m[1], n, m[1], fields[m[1]])
		}
	}
	return nil
}

// keyOfType says a value of key decoded on its own is of the wrong JSON
// type, as jsonerr.Value says a struct field's.
func keyOfType(key, want string, err error) error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fmt.Errorf("%s is a JSON %s, want %s", key, te.Value, want)
	}
	return fmt.Errorf("%s: %w", key, err)
}

// checkMeasured refuses a plan that gives no time or a negative axis,
// naming it by nums[i], its number in the file.
func checkMeasured(path string, ps []MeasuredPlan, nums []int) ([]MeasuredPlan, error) {
	if len(ps) == 0 {
		return nil, fmt.Errorf("%s: no measured plans", path)
	}
	for i, p := range ps {
		n := nums[i]
		if !(p.StepMs > 0) || math.IsInf(p.StepMs, 0) {
			return nil, fmt.Errorf("%s: plan %d: step_ms must be a positive time, got %g", path, n, p.StepMs)
		}
		for _, f := range []struct {
			key string
			v   int
		}{{"tp", p.TP}, {"pp", p.PP}, {"dp", p.DP}, {"ep", p.EP}, {"cp", p.CP}, {"vpp", p.VPP},
			{"microbatch_size", p.MicroBatch}, {"microbatches", p.Microbatches}, {"zero", p.Zero}, {"batch", p.Batch}} {
			if f.v < 0 {
				return nil, fmt.Errorf("%s: plan %d: %s must not be negative, got %d (leave it out for the default)", path, n, f.key, f.v)
			}
		}
		// Bounded as the flags are, and their products with them: a
		// product past an int's range had wrapped to 0 and divided by it.
		devices, batch := 1, 1
		for _, f := range []struct {
			key string
			v   int
		}{{"tp", p.TP}, {"pp", p.PP}, {"dp", p.DP}, {"ep", p.EP}, {"cp", p.CP}} {
			if devices *= max(f.v, 1); f.v > compile.MaxDevices || devices > compile.MaxDevices {
				return nil, fmt.Errorf("%s: plan %d: %s = %d makes more than %d devices", path, n, f.key, f.v, compile.MaxDevices)
			}
		}
		if p.Microbatches > compile.MaxMicrobatches {
			return nil, fmt.Errorf("%s: plan %d: microbatches %d: past the %d a compiled program holds", path, n, p.Microbatches, compile.MaxMicrobatches)
		}
		for _, f := range []struct {
			key string
			v   int
		}{{"microbatch_size", p.MicroBatch}, {"microbatches", p.Microbatches}, {"dp", p.DP}, {"ep", p.EP}} {
			if batch *= max(f.v, 1); f.v > maxRowBatch || batch > maxRowBatch {
				return nil, fmt.Errorf("%s: plan %d: microbatch_size × microbatches × dp·ep is past %d sequences", path, n, maxRowBatch)
			}
		}
		if p.Batch > maxRowBatch {
			return nil, fmt.Errorf("%s: plan %d: batch %d is past %d sequences", path, n, p.Batch, maxRowBatch)
		}
		// Config takes batch over the microbatches: a row whose fields
		// disagree would be priced as another plan than the one that ran.
		if p.Batch > 0 && p.MicroBatch > 0 && p.Microbatches > 0 && batch != p.Batch {
			return nil, fmt.Errorf("%s: plan %d: microbatch_size %d × microbatches %d × dp·ep %d is %d sequences a step, and its batch %d: give the fields of the plan that ran",
				path, n, p.MicroBatch, p.Microbatches, max(p.DP, 1)*max(p.EP, 1), batch, p.Batch)
		}
	}
	return ps, nil
}

// maxRowBatch bounds a measured row's batch as --batch is bounded.
const maxRowBatch = compile.MaxBatch

// repeatedKey is a key of the JSON object e given twice, or "".
func repeatedKey(e json.RawMessage) string {
	dec := json.NewDecoder(bytes.NewReader(e))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return ""
	}
	seen := map[string]bool{}
	for dec.More() {
		kt, err := dec.Token()
		if err != nil {
			return ""
		}
		k, _ := kt.(string)
		if seen[k] {
			return k
		}
		seen[k] = true
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return ""
		}
	}
	return ""
}

// Config is the measured plan over base (the model and options of the
// command line; the batch too, unless the row gives its own: batch, or
// microbatch_size × microbatches × dp·ep); its Validate names a plan that
// cannot exist.
func (p MeasuredPlan) Config(base compile.Config) compile.Config {
	c := base
	c.TP, c.PP, c.DP, c.EP, c.CP, c.VPP = max(p.TP, 1), max(p.PP, 1), max(p.DP, 1), max(p.EP, 1), max(p.CP, 1), p.VPP
	if p.CPImpl != "" {
		c.CPImpl = p.CPImpl
	}
	if p.CPLayout != "" {
		c.CPLayout = p.CPLayout
	}
	switch {
	case p.Batch > 0:
		c.Batch = p.Batch
	case p.MicroBatch > 0 && p.Microbatches > 0:
		// A row says its batch: microbatch size × count × replicas.
		c.Batch = p.MicroBatch * p.Microbatches * c.DP * c.EP
	}
	c.Devices = c.TP * c.PP * c.DP * c.EP * c.CP
	c.Microbatches = max(p.Microbatches, 1)
	c.MicroBatchSize = 0
	if p.MicroBatch > 0 && p.Microbatches == 0 {
		c.MicroBatchSize = p.MicroBatch
	}
	c.Zero, c.SequenceParallel, c.Recompute, c.Offload, c.Schedule = p.Zero, p.SequenceParallel, p.Recompute, p.Offload, p.Schedule
	if p.OverlapGradReduce != nil {
		c.SerialGradReduce = !*p.OverlapGradReduce
	}
	if p.GradReduceDType != "" {
		c.GradReduceDType = p.GradReduceDType
	}
	c.Explicit = map[string]bool{"microbatches": p.Microbatches > 0, "micro-batch-size": c.MicroBatchSize > 0}
	return c
}

// CalibrateCompiled is CalibrateSteps for a model small enough to
// compile (the planner's table then reports compiled plans' predictions):
// each measured plan is compiled once from girFor(its batch), the model's
// module file built at that batch, and priced by cost.Hardware.Predict,
// as the table prices it.
func CalibrateCompiled(hw *cost.Hardware, girFor func(batch int) (string, error), base compile.Config, ps []MeasuredPlan) (*cost.Hardware, *cost.StepCalibration, error) {
	base.Set, base.Built, base.MemLimit = "", "", 0
	pts, err := stepPoints(base, ps, func(cfg compile.Config) (func(*cost.Hardware) (float64, error), error) {
		gir, err := girFor(cfg.Batch)
		if err != nil {
			return nil, err
		}
		cfg.Model = gir
		res, err := compile.Compile(&cfg, passes.Hooks{})
		if err != nil {
			return nil, err
		}
		return func(h *cost.Hardware) (float64, error) {
			pred, err := h.Predict(res.Programs, res.Schedule)
			if err != nil {
				return 0, err
			}
			return pred.StepSeconds, nil
		}, nil
	})
	if err != nil {
		return nil, nil, err
	}
	return hw.CalibrateSteps(pts)
}

// CalibrateSteps fits hw to the measured plans of the model of shape t,
// each priced by the planner's estimate (its pipeline in closed form), as
// cost.Hardware.CalibrateSteps does. A plan that cannot exist for the
// model is a named error.
func CalibrateSteps(hw *cost.Hardware, t cost.Transformer, base compile.Config, ps []MeasuredPlan) (*cost.Hardware, *cost.StepCalibration, error) {
	pts, err := stepPoints(base, ps, func(cfg compile.Config) (func(*cost.Hardware) (float64, error), error) {
		plan := planOf(cfg)
		return func(h *cost.Hardware) (float64, error) {
			e, err := h.EstimateFast(t, plan)
			if err != nil {
				return 0, err
			}
			return e.StepSeconds, nil
		}, nil
	})
	if err != nil {
		return nil, nil, err
	}
	return hw.CalibrateSteps(pts)
}

// stepPoints are the measured plans over base as calibration points,
// each validated (a plan that cannot exist is named by its place in the
// file and its axes) and priced as price says.
//
// A plan measured more than once is one point, its time the mean of the
// measurements: copies of one plan would count as evidence for as many
// parameters, and the leave-one-out error would predict each copy from
// the others. Measurements of one plan more than sameRunSpread apart are
// refused: one of them is not this plan's step.
func stepPoints(base compile.Config, ps []MeasuredPlan, price func(compile.Config) (func(*cost.Hardware) (float64, error), error)) ([]cost.StepPoint, error) {
	var pts []cost.StepPoint
	type seen struct {
		point, first int // index in pts; the first measurement's number
		lo, hi       float64
		times        []float64
	}
	byPlan := map[cost.Plan]*seen{} // what the estimate prices: the same key, the same plan
	for i, p := range ps {
		cfg := p.Config(base)
		if err := cfg.Validate(); err != nil {
			return nil, fmt.Errorf("calibration point %d (%s): %w", i+1, Describe(cfg), err)
		}
		// Named once Validate has made a microbatch size into its count.
		name := Describe(cfg)
		key := planOf(cfg)
		if s := byPlan[key]; s != nil {
			s.lo, s.hi = math.Min(s.lo, p.StepMs), math.Max(s.hi, p.StepMs)
			if s.hi > sameRunSpread*s.lo {
				return nil, fmt.Errorf("calibration points %d and %d are the same plan (%s), measured at %.4g and %.4g ms: more than %.1f× apart, one of them is not this plan's step",
					s.first, i+1, name, ps[s.first-1].StepMs, p.StepMs, sameRunSpread)
			}
			s.times = append(s.times, p.StepMs/1e3)
			pts[s.point].Measured = mean(s.times)
			pts[s.point].Name = fmt.Sprintf("%s (%d measurements)", name, len(s.times))
			continue
		}
		pr, err := price(cfg)
		if err != nil {
			return nil, fmt.Errorf("calibration point %d (%s): %w", i+1, name, err)
		}
		byPlan[key] = &seen{point: len(pts), first: i + 1, lo: p.StepMs, hi: p.StepMs, times: []float64{p.StepMs / 1e3}}
		pts = append(pts, cost.StepPoint{Name: name, Measured: p.StepMs / 1e3, Price: pr})
	}
	return pts, nil
}

// sameRunSpread is how far apart two measurements of one plan may be:
// steps of one plan on one cluster vary by percents, not by half.
const sameRunSpread = 1.5

func mean(xs []float64) float64 {
	s := 0.0
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

// setDiff says how two --set lists differ, key by key ("" when they give
// the same values): "seq=64 ran, seq=32 here", "attention=unfused ran,
// not given here".
func setDiff(ran, here string) string {
	parse := func(set string) map[string]string {
		m := map[string]string{}
		for _, kv := range strings.Split(set, ",") {
			if k, v, ok := strings.Cut(strings.TrimSpace(kv), "="); ok {
				m[strings.TrimSpace(k)] = strings.TrimSpace(v)
			}
		}
		return m
	}
	a, b := parse(ran), parse(here)
	var diffs []string
	for _, k := range slices.Sorted(maps.Keys(a)) {
		switch v, ok := b[k]; {
		case !ok:
			diffs = append(diffs, fmt.Sprintf("%s=%s ran, not given here", k, a[k]))
		case v != a[k]:
			diffs = append(diffs, fmt.Sprintf("%s=%s ran, %s=%s here", k, a[k], k, v))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(b)) {
		if _, ok := a[k]; !ok {
			diffs = append(diffs, fmt.Sprintf("%s=%s here, not given to the run", k, b[k]))
		}
	}
	return strings.Join(diffs, "; ")
}
