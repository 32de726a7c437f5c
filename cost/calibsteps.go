package cost

import (
	"errors"
	"fmt"
	"math"
	"slices"
)

// StepPoint is one measured step for CalibrateSteps: a plan that ran, its
// measured step time, and how to price it under a hardware description.
type StepPoint struct {
	Name     string  // how the report names it (the plan)
	Measured float64 // seconds
	Price    func(*Hardware) (float64, error)
}

// PointFit is one point of a calibration: measured, predicted under the
// preset, under the fitted description, and with the point left out of
// the fit (LeftOut; 0 when there was nothing to fit without it).
type PointFit struct {
	Name                             string
	Measured, Before, After, LeftOut float64
}

// StepCalibration says what CalibrateSteps fitted and how well the
// result predicts the points: mean |predicted/measured − 1| before and
// after, and leave-one-out (each point predicted by a fit to the others:
// the error to expect on a plan not measured).
type StepCalibration struct {
	Params                  []RefinedParam
	Fitted                  int
	Points                  []PointFit
	ErrorBefore, ErrorAfter float64
	// MissAfter is the mean of max(predicted/measured,
	// measured/predicted) − 1 after the fit: the miss counted alike
	// whichever way it goes, where |predicted/measured − 1| can never
	// pass 100 % for steps priced too fast (a unit or a plan that is not
	// the one measured), and a refusal on it never came.
	MissAfter float64
	// LeaveOneOut is the mean error of the left-out predictions; HasLOO
	// is false with a single point.
	LeaveOneOut float64
	HasLOO      bool
	// Unfitted are the parameters some point depends on that were kept
	// for want of points: the description keeps its own figures for
	// them, which a user who knows the cluster's should set.
	Unfitted []string
}

// stepParam is a figure CalibrateSteps may fit, with the bounds no fit
// may cross: efficiencies stay in (0, 1], and every other figure within
// a factor of the description's own (a datasheet's link is not 10× off;
// a fit that wants it to be is fitting noise or a missing term): links
// within [1/10, 2]×, fixed costs within [1/10, 10]×, the inter-node
// latency within [1/4, 20]× (a fabric's latency under load is far above
// its datasheet's, never far below).
type stepParam struct {
	key    string
	get    func(*Hardware) float64
	set    func(*Hardware, float64)
	lo, hi func(v float64) float64
}

// stepParams in the order they are fitted: with fewer points than
// parameters, the first ones (those every step depends on most) are.
var stepParams = []stepParam{
	{"gemm_efficiency", func(h *Hardware) float64 { return h.GEMMEfficiency }, func(h *Hardware, v float64) { h.GEMMEfficiency = v },
		func(float64) float64 { return 0.05 }, func(float64) float64 { return 1 }},
	{"inter_node_gbps", func(h *Hardware) float64 { return h.InterGBps }, func(h *Hardware, v float64) { h.InterGBps = v },
		func(v float64) float64 { return v / 10 }, func(v float64) float64 { return v * 2 }},
	{"intra_node_gbps", func(h *Hardware) float64 { return h.IntraGBps }, func(h *Hardware, v float64) { h.IntraGBps = v },
		func(v float64) float64 { return v / 10 }, func(v float64) float64 { return v * 2 }},
	// host_op_us starts at 0 in the presets: its search runs over
	// [1, 200] µs (or 10× a figure already set), and a fit that does not
	// lower the error keeps the start.
	{"host_op_us", func(h *Hardware) float64 { return h.HostOpUS }, func(h *Hardware, v float64) { h.HostOpUS = v },
		func(float64) float64 { return 1 }, func(v float64) float64 { return max(200, 10*v) }},
	{"gemm_half_us", func(h *Hardware) float64 { return h.GEMMHalfUS }, func(h *Hardware, v float64) { h.GEMMHalfUS = v },
		func(v float64) float64 { return v / 10 }, func(v float64) float64 { return v * 10 }},
	{"launch_us", func(h *Hardware) float64 { return h.LaunchUS }, func(h *Hardware, v float64) { h.LaunchUS = v },
		func(v float64) float64 { return v / 10 }, func(v float64) float64 { return v * 10 }},
	{"mem_efficiency", func(h *Hardware) float64 { return h.MemEfficiency }, func(h *Hardware, v float64) { h.MemEfficiency = v },
		func(float64) float64 { return 0.05 }, func(float64) float64 { return 1 }},
	{"inter_node_latency_us", func(h *Hardware) float64 { return h.InterLatencyUS }, func(h *Hardware, v float64) { h.InterLatencyUS = v },
		func(v float64) float64 { return v / 4 }, func(v float64) float64 { return v * 20 }},
}

// maxStepRatio is the furthest a measured step may lie from the
// description's price for it: the fitted figures move within a factor of
// 10 or so (stepParams), so a step 100× off is a wrong unit or another
// plan's time, and a fit to it would pin figures at their bounds.
const maxStepRatio = 100.0

// sensitivity is the relative change of a point's prediction, below
// which a parameter is taken to be one the points say nothing about.
const sensitivity = 0.005

// CalibrateSteps fits h's efficiencies, links and fixed costs to measured
// step times (seconds) of whole plans: least squares on
// ln(predicted/measured), each parameter within its bounds
// (stepParams). It fits at most one parameter fewer than there are
// points (one with a single point), in stepParams' order, and only those
// some point's prediction depends on; the report says of every parameter
// whether it was fitted and why not, and gives the leave-one-out error.
func (h *Hardware) CalibrateSteps(points []StepPoint) (*Hardware, *StepCalibration, error) {
	if len(points) == 0 {
		return nil, nil, errors.New("calibration: no measured steps")
	}
	for i, p := range points {
		if !(p.Measured > 0) || math.IsInf(p.Measured, 0) {
			return nil, nil, fmt.Errorf("calibration point %d (%s): the measured step must be a positive time, got %g s", i+1, p.Name, p.Measured)
		}
		pred, err := p.Price(h)
		if err != nil {
			return nil, nil, fmt.Errorf("calibration point %d (%s): %w", i+1, p.Name, err)
		}
		if !(pred > 0) || math.IsInf(pred, 0) {
			return nil, nil, fmt.Errorf("calibration point %d (%s): the plan prices at %g s", i+1, p.Name, pred)
		}
		if r := p.Measured / pred; r > maxStepRatio || r < 1/maxStepRatio {
			return nil, nil, fmt.Errorf("calibration point %d (%s): measured %.4g ms where %s prices the plan at %.4g ms, %.3g× apart: no figure within its bounds explains that (is the time in milliseconds, of one step of this plan?)",
				i+1, p.Name, p.Measured*1e3, h.Name, pred*1e3, math.Max(r, 1/r))
		}
	}
	rep := &StepCalibration{}
	var movable []int
	why := map[string]string{}
	for pi, sp := range stepParams {
		if h.given[sp.key] {
			why[sp.key] = fmt.Sprintf("set on the command line (%s=%g): kept", sp.key, sp.get(h))
			continue
		}
		if moves(h, sp, points) {
			movable = append(movable, pi)
		} else {
			why[sp.key] = "no measured plan's step depends on it"
		}
	}
	limit := max(len(points)-1, 1)
	fitted, err := h.fitSteps(movable[:min(len(movable), limit)], points)
	if err != nil {
		return nil, nil, err
	}
	if len(movable) > limit {
		// A parameter the fit left where it was (at the bound the points
		// push it against, or where no value lowers the error) gives its
		// slot to the next one, once.
		var moved, still []int
		for _, pi := range movable[:limit] {
			if sp := stepParams[pi]; sp.get(fitted) != sp.get(h) {
				moved = append(moved, pi)
			} else {
				still = append(still, pi)
			}
		}
		if len(still) > 0 {
			next := append(moved, movable[limit:]...)
			cut := min(len(next), limit)
			movable = append(slices.Clone(next[:cut]), next[cut:]...)
			if fitted, err = h.fitSteps(movable[:cut], points); err != nil {
				return nil, nil, err
			}
			for _, pi := range still {
				sp := stepParams[pi]
				why[sp.key] = fmt.Sprintf("the fit left it at %.4g (its bounds [%.4g, %.4g] hold no value that lowers the error), and gave its place to the next parameter", sp.get(h), sp.lo(sp.get(h)), sp.hi(sp.get(h)))
			}
		}
		verb := "fit"
		if len(points) == 1 {
			verb = "fits"
		}
		cut := min(len(movable), limit)
		for _, pi := range movable[cut:] {
			why[stepParams[pi].key] = fmt.Sprintf("%s %s at most %s", count(len(points), "measured plan"), verb, count(limit, "parameter"))
			rep.Unfitted = append(rep.Unfitted, stepParams[pi].key)
		}
		movable = movable[:cut]
	}
	for _, sp := range stepParams {
		before, after := sp.get(h), sp.get(fitted)
		p := RefinedParam{Key: sp.key, Before: before, After: after, Samples: len(points), Kept: why[sp.key] != "", Why: why[sp.key]}
		if !p.Kept {
			lo, hi := sp.lo(before), sp.hi(before)
			atBound := math.Abs(math.Log(after/lo)) < 0.01 || math.Abs(math.Log(after/hi)) < 0.01
			switch {
			case atBound && after == before:
				// It started at the bound the points push it against: nothing
				// was fitted.
				p.Kept = true
				p.Why = fmt.Sprintf("already at its bound [%.4g, %.4g], and the points ask for more", lo, hi)
			case after == before:
				p.Kept = true
				p.Why = "no value within its bounds lowers the error: kept"
			case atBound:
				rep.Fitted++
				p.Why = fmt.Sprintf("at its bound [%.4g, %.4g]: the points ask for more, which this parameter alone should not explain", lo, hi)
			default:
				rep.Fitted++
			}
		}
		rep.Params = append(rep.Params, p)
	}
	for i, p := range points {
		before, _ := p.Price(h)
		after, err := p.Price(fitted)
		if err != nil {
			return nil, nil, fmt.Errorf("calibration point %d (%s): %w", i+1, p.Name, err)
		}
		rep.Points = append(rep.Points, PointFit{Name: p.Name, Measured: p.Measured, Before: before, After: after})
		rep.ErrorBefore += math.Abs(before/p.Measured-1) / float64(len(points))
		rep.ErrorAfter += math.Abs(after/p.Measured-1) / float64(len(points))
		rep.MissAfter += (max(after/p.Measured, p.Measured/after) - 1) / float64(len(points))
	}
	if len(points) >= 2 {
		rep.HasLOO = true
		for i := range points {
			rest := slices.Delete(slices.Clone(points), i, i+1)
			k := min(len(movable), max(len(rest)-1, 1))
			loo, err := h.fitStepsFrom(h, movable[:k], rest, false)
			if err != nil {
				return nil, nil, err
			}
			pred, err := points[i].Price(loo)
			if err != nil {
				return nil, nil, err
			}
			rep.Points[i].LeftOut = pred
			rep.LeaveOneOut += math.Abs(pred/points[i].Measured-1) / float64(len(points))
		}
	}
	if err := fitted.Validate(); err != nil {
		return nil, nil, fmt.Errorf("calibrated hardware: %w", err)
	}
	fitted.Source += fmt.Sprintf("; %d parameters calibrated on %d measured steps", rep.Fitted, len(points))
	return fitted, rep, nil
}

// Headline says how many measured plans of source fitted how many
// parameters.
func (r *StepCalibration) Headline(source string) string {
	return fmt.Sprintf("from %s of %s: %s fitted", count(len(r.Points), "measured plan"), source, count(r.Fitted, "parameter"))
}

// count is n things, "1 thing" or "n things".
func count(n int, thing string) string {
	if n == 1 {
		return "1 " + thing
	}
	return fmt.Sprintf("%d %ss", n, thing)
}

// moves says whether changing parameter sp changes some point's
// prediction by more than sensitivity.
func moves(h *Hardware, sp stepParam, points []StepPoint) bool {
	v := sp.get(h)
	probe := h.clone()
	w := v * 1.5
	if v == 0 {
		w = sp.hi(v) / 4 // a figure that starts unset: probe well inside its range
	}
	if w > sp.hi(v) {
		w = v / 1.5
	}
	sp.set(probe, w)
	for _, p := range points {
		a, err1 := p.Price(h)
		b, err2 := p.Price(probe)
		if err1 == nil && err2 == nil && math.Abs(b/a-1) > sensitivity {
			return true
		}
	}
	return false
}

// fitSteps minimizes Σ ln²(predicted/measured) over the parameters
// stepParams[idx], each within its bounds (the starting description's),
// in two stages. Levenberg–Marquardt on the parameters' logarithms comes
// first: correlated figures (the GEMM efficiency and a link both set most
// steps) make a long valley of the error, along which coordinate descent
// crawls, a percent a sweep, and did not reach the bottom in 60 sweeps of
// a few points, each sweep pricing every point a thousand times. Then
// coordinate descent (a golden-section search of each logarithm in turn)
// polishes where the prices are not smooth, and takes a parameter that
// starts at 0 (host_op_us in the presets) from there only if a value
// within its bounds lowers the error.
func (h *Hardware) fitSteps(idx []int, points []StepPoint) (*Hardware, error) {
	return h.fitStepsFrom(h, idx, points, true)
}

// fitStepsFrom is fitSteps from start's figures for stepParams[idx]
// rather than h's (the bounds stay h's); without polish only
// Levenberg–Marquardt runs: the leave-one-out fits, which start from h as
// the whole fit does (started from the whole fit's figures they stopped
// early near them and read optimistic), skip the sweeps that would
// otherwise make a hundred points' calibration take minutes.
func (h *Hardware) fitStepsFrom(start *Hardware, idx []int, points []StepPoint, polish bool) (*Hardware, error) {
	loss := func(c *Hardware) float64 {
		var s float64
		for _, p := range points {
			pred, err := p.Price(c)
			if err != nil || !(pred > 0) {
				return math.Inf(1)
			}
			l := math.Log(pred / p.Measured)
			s += l * l
		}
		return s
	}
	from := h.clone()
	for _, pi := range idx {
		stepParams[pi].set(from, stepParams[pi].get(start))
	}
	cur := h.levenbergMarquardt(from, idx, points)
	if loss(cur) > loss(from) {
		cur = from
	}
	// Levenberg–Marquardt has found the valley's floor where the prices
	// are smooth: a few sweeps polish it where they are not.
	const sweeps, iters = 8, 30
	phi := (math.Sqrt(5) - 1) / 2
	for range sweeps {
		if !polish {
			break
		}
		before := loss(cur)
		for _, pi := range idx {
			sp := stepParams[pi]
			v0 := sp.get(h)
			a, b := math.Log(sp.lo(v0)), math.Log(sp.hi(v0))
			at := func(x float64) float64 {
				c := cur.clone()
				sp.set(c, math.Exp(x))
				return loss(c)
			}
			x1, x2 := b-phi*(b-a), a+phi*(b-a)
			f1, f2 := at(x1), at(x2)
			for range iters {
				if f1 < f2 {
					b, x2, f2 = x2, x1, f1
					x1 = b - phi*(b-a)
					f1 = at(x1)
				} else {
					a, x1, f1 = x1, x2, f2
					x2 = a + phi*(b-a)
					f2 = at(x2)
				}
			}
			best := (a + b) / 2
			// Keep the current value unless the search found better.
			if at(best) < loss(cur) {
				sp.set(cur, math.Exp(best))
			}
		}
		if loss(cur) >= before*(1-1e-7) {
			break
		}
	}
	// A figure that starts at 0 stays there where its fitted value gains
	// nothing: it is not a parameter the points ask for.
	for _, pi := range idx {
		if sp := stepParams[pi]; sp.get(h) == 0 && sp.get(cur) != 0 {
			c := cur.clone()
			sp.set(c, 0)
			if loss(c) <= loss(cur)*(1+1e-9) {
				cur = c
			}
		}
	}
	return cur, nil
}

// levenbergMarquardt fits stepParams[idx] to points by Levenberg–
// Marquardt on the parameters' logarithms from from's figures, each held
// within h's bounds for it (a parameter at a bound the step pushes
// against is held there), the Jacobian by forward differences. A
// parameter that starts at 0 starts at the geometric middle of its
// bounds. It returns from where the prices cannot be had.
func (h *Hardware) levenbergMarquardt(from *Hardware, idx []int, points []StepPoint) *Hardware {
	k, n := len(idx), len(points)
	lo, hi, x := make([]float64, k), make([]float64, k), make([]float64, k)
	for j, pi := range idx {
		sp := stepParams[pi]
		v0 := sp.get(h)
		lo[j], hi[j] = math.Log(sp.lo(v0)), math.Log(sp.hi(v0))
		x[j] = (lo[j] + hi[j]) / 2
		if v := sp.get(from); v > 0 {
			x[j] = min(max(math.Log(v), lo[j]), hi[j])
		}
	}
	at := func(x []float64) *Hardware {
		c := from.clone()
		for j, pi := range idx {
			stepParams[pi].set(c, math.Exp(x[j]))
		}
		return c
	}
	residuals := func(x []float64) ([]float64, float64) {
		c := at(x)
		r := make([]float64, n)
		var s float64
		for i, p := range points {
			pred, err := p.Price(c)
			if err != nil || !(pred > 0) || math.IsInf(pred, 0) {
				return nil, math.Inf(1)
			}
			r[i] = math.Log(pred / p.Measured)
			s += r[i] * r[i]
		}
		return r, s
	}
	r, f := residuals(x)
	if r == nil || k == 0 {
		return from.clone()
	}
	const eps = 1e-4 // the difference step, in the logarithm
	lambda := 1e-3
	for range 100 {
		jac := make([][]float64, k) // jac[j][i] = ∂r_i/∂x_j
		for j := range k {
			step := eps
			if x[j]+step > hi[j] {
				step = -eps
			}
			xj := slices.Clone(x)
			xj[j] += step
			rj, _ := residuals(xj)
			if rj == nil {
				return at(x)
			}
			jac[j] = make([]float64, n)
			for i := range n {
				jac[j][i] = (rj[i] - r[i]) / step
			}
		}
		g := make([]float64, k)
		a := make([][]float64, k)
		for j := range k {
			a[j] = make([]float64, k)
			for i := range n {
				g[j] += jac[j][i] * r[i]
			}
			for l := range k {
				for i := range n {
					a[j][l] += jac[j][i] * jac[l][i]
				}
			}
		}
		// Parameters held at a bound the descent pushes against.
		var free []int
		for j := range k {
			if x[j] <= lo[j]+1e-12 && g[j] > 0 || x[j] >= hi[j]-1e-12 && g[j] < 0 {
				continue
			}
			free = append(free, j)
		}
		if len(free) == 0 {
			break
		}
		improved := false
		for lambda < 1e12 {
			m := make([][]float64, len(free))
			rhs := make([]float64, len(free))
			for p, j := range free {
				m[p] = make([]float64, len(free))
				for q, l := range free {
					m[p][q] = a[j][l]
				}
				m[p][p] += lambda*a[j][j] + 1e-12
				rhs[p] = -g[j]
			}
			d, ok := solve(m, rhs)
			if !ok {
				lambda *= 4
				continue
			}
			xn := slices.Clone(x)
			for p, j := range free {
				xn[j] = min(max(x[j]+d[p], lo[j]), hi[j])
			}
			rn, fn := residuals(xn)
			if rn != nil && fn < f {
				gain := (f - fn) / f
				x, r, f = xn, rn, fn
				lambda = max(lambda/3, 1e-9)
				improved = gain > 1e-10
				break
			}
			lambda *= 4
		}
		if !improved {
			break
		}
	}
	return at(x)
}

// solve solves m·x = b by Gaussian elimination with partial pivoting;
// ok is false for a singular m.
func solve(m [][]float64, b []float64) (x []float64, ok bool) {
	n := len(b)
	for c := range n {
		p := c
		for r := c + 1; r < n; r++ {
			if math.Abs(m[r][c]) > math.Abs(m[p][c]) {
				p = r
			}
		}
		if m[p][c] == 0 || math.IsNaN(m[p][c]) {
			return nil, false
		}
		m[c], m[p] = m[p], m[c]
		b[c], b[p] = b[p], b[c]
		for r := c + 1; r < n; r++ {
			f := m[r][c] / m[c][c]
			for k := c; k < n; k++ {
				m[r][k] -= f * m[c][k]
			}
			b[r] -= f * b[c]
		}
	}
	x = make([]float64, n)
	for r := n - 1; r >= 0; r-- {
		s := b[r]
		for k := r + 1; k < n; k++ {
			s -= m[r][k] * x[k]
		}
		x[r] = s / m[r][r]
	}
	return x, true
}
