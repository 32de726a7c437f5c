package cost

import "gcompile/lower"

// DeviceBusy prices rank r of prog alone, without Predict's classes.
func DeviceBusy(h *Hardware, prog *lower.Program, r int) float64 { return h.priceDevice(prog, r).busy }
