package cost

import (
	"math"
	"testing"
	"time"

	"gcompile/ir"
)

// geluCost is the op table's flops and bytes of a GELU of n elements.
func geluCost(n int) (int64, int64) {
	info, _ := ir.Lookup("gelu")
	t := ir.T(ir.F32, n)
	return info.Cost([]ir.Type{t}, t, nil)
}

// TestCalibrate: calibration on this machine gives a valid cpu
// description whose rates are positive, in well under a second on an idle
// machine (the bound here is loose for a loaded one), and says what it
// measured.
func TestCalibrate(t *testing.T) {
	start := time.Now()
	h, err := Calibrate()
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	if err := h.Validate(); err != nil {
		t.Fatal(err)
	}
	if h.Name != "cpu" || h.HostCores != 1 || h.GEMMEfficiency != 1 {
		t.Errorf("calibrated %+v", h)
	}
	pre, _ := Preset("cpu")
	if h.Source == pre.Source {
		t.Error("the calibrated description does not say what it measured")
	}
	// A GEMM of 256³ on the calibrated curve takes about what it was
	// measured to take: the fit reproduces its largest point within 2×.
	got := h.gemm(256, 256, 256, "fp32", 4)
	if f := 2 * 256.0 * 256 * 256; !(got > 0 && f/got < 2*h.Peak("fp32")) {
		t.Errorf("256³ GEMM priced at %g s", got)
	}
	// The backend's GELU (a float64 tanh per element) is far slower than
	// the memory bound a copy reaches: calibration gives it a scale above
	// 1, which OpTime applies. (Its size depends on the machine and on
	// what else runs while it is timed, so only its side of 1 is checked.)
	k, ok := h.OpScale["gelu"]
	if !ok || !(k > 1) {
		t.Fatalf("gelu's op scale %v (of %v), want above 1", k, h.OpScale)
	}
	f, by := geluCost(1 << 18)
	unscaled := *h
	unscaled.OpScale = nil
	launch := h.LaunchUS * 1e-6
	if got, want := h.OpTime("gelu", ir.F32, f, by)-launch, k*(unscaled.OpTime("gelu", ir.F32, f, by)-launch); math.Abs(got-want) > 1e-9*want {
		t.Errorf("gelu priced %.3g s beyond the launch, want the scaled roofline's %.3g s", got, want)
	}
	if took > 5*time.Second {
		t.Errorf("calibration took %v", took)
	}
	t.Logf("%v: %s", took, h.Source)
}
