package ir

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// ParseInit reads a param's init attribute: "zeros" (or ""), "ones", or
// "normal(std)" with a finite std ≥ 0. normal is false for the fills,
// std their value (0 or 1).
func ParseInit(init string) (std float64, normal bool, err error) {
	switch init {
	case "", "zeros":
		return 0, false, nil
	case "ones":
		return 1, false, nil
	}
	arg, isNormal := strings.CutPrefix(init, "normal(")
	arg, closed := strings.CutSuffix(arg, ")")
	if !isNormal || !closed {
		return 0, false, fmt.Errorf("unknown init %q (want normal(std), zeros or ones)", init)
	}
	std, err = strconv.ParseFloat(arg, 64)
	if err != nil || !(std >= 0) || math.IsInf(std, 0) {
		return 0, false, fmt.Errorf("init %q: the std must be a finite number ≥ 0", init)
	}
	return std, true, nil
}
