package cost

import (
	"testing"
	"time"
)

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
	if took > 5*time.Second {
		t.Errorf("calibration took %v", took)
	}
	t.Logf("%v: %s", took, h.Source)
}
