package dist

import (
	"fmt"
	"strconv"
	"strings"
)

// nodeTasks is one entry of Slurm's compressed tasks-per-node list:
// `tasks` tasks on each of `repeat` consecutive nodes.
type nodeTasks struct{ tasks, repeat int }

// parseTasksPerNode reads Slurm's compressed tasks-per-node form, e.g.
// "2(x3),1": three nodes with 2 tasks, then one with 1. Repeats are kept
// as counts, not expanded, so "1(x999999999)" costs nothing.
func parseTasksPerNode(v string) ([]nodeTasks, error) {
	bad := func(why string) error {
		return fmt.Errorf("%q is not Slurm's tasks-per-node form (N or N(xM), comma separated): %s", v, why)
	}
	var out []nodeTasks
	for _, entry := range strings.Split(v, ",") {
		num, rep, hasRep := strings.Cut(entry, "(")
		tasks, err := positive(num)
		if err != nil {
			return nil, bad(fmt.Sprintf("task count %q %v", num, err))
		}
		repeat := 1
		if hasRep {
			inner, ok := strings.CutPrefix(rep, "x")
			if !ok || !strings.HasSuffix(inner, ")") {
				return nil, bad(fmt.Sprintf("repeat %q is not (xM)", "("+rep))
			}
			if repeat, err = positive(strings.TrimSuffix(inner, ")")); err != nil {
				return nil, bad(fmt.Sprintf("repeat %q %v", "("+rep, err))
			}
		}
		out = append(out, nodeTasks{tasks, repeat})
	}
	return out, nil
}

// positive parses a decimal integer ≥ 1 made of digits only (no sign,
// no spaces), as Slurm writes them.
func positive(s string) (int, error) {
	if s == "" || strings.TrimLeft(s, "0123456789") != "" {
		return 0, fmt.Errorf("is not a number")
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("is out of range")
	}
	if n < 1 {
		return 0, fmt.Errorf("is not at least 1")
	}
	return n, nil
}

// firstHost is the first host of a Slurm hostlist such as
// "node[001-004,007],gpu5" (node001) or "rack[1-2]-n[3-4]" (rack1-n3):
// the first element of every bracket group, zero padding kept. The whole
// list is checked so that a mangled variable is reported, not half used.
func firstHost(list string) (string, error) {
	bad := func(why string) error {
		return fmt.Errorf("%q is not a Slurm hostlist: %s", list, why)
	}
	var (
		first   strings.Builder
		inFirst = true // still inside the first host expression
		expr    = 0    // bytes in the current host expression
	)
	for i := 0; i < len(list); {
		c := list[i]
		switch c {
		case ',':
			if expr == 0 {
				return "", bad(fmt.Sprintf("empty host name at byte %d", i))
			}
			inFirst, expr = false, 0
			i++
		case '[':
			end := strings.IndexByte(list[i:], ']')
			if end < 0 {
				return "", bad(fmt.Sprintf("the [ at byte %d is never closed", i))
			}
			start, err := firstOfRanges(list[i+1 : i+end])
			if err != nil {
				return "", bad(fmt.Sprintf("range [%s]: %v", list[i+1:i+end], err))
			}
			if inFirst {
				first.WriteString(start)
			}
			expr++
			i += end + 1
		case ']':
			return "", bad(fmt.Sprintf("the ] at byte %d closes nothing", i))
		default:
			if c <= ' ' || c == 0x7f {
				return "", bad(fmt.Sprintf("control or space character at byte %d", i))
			}
			if inFirst {
				first.WriteByte(c)
			}
			expr++
			i++
		}
	}
	if expr == 0 {
		return "", bad("it ends with an empty host name")
	}
	return first.String(), nil
}

// firstOfRanges checks a bracket group's body, "001-004,007", and returns
// its first number as written.
func firstOfRanges(body string) (string, error) {
	if body == "" {
		return "", fmt.Errorf("empty")
	}
	if strings.ContainsRune(body, '[') {
		return "", fmt.Errorf("nested [")
	}
	var first string
	for i, item := range strings.Split(body, ",") {
		lo, hi, isRange := strings.Cut(item, "-")
		if !digits(lo) || (isRange && !digits(hi)) {
			return "", fmt.Errorf("%q is not N or N-M", item)
		}
		if isRange {
			a, errA := strconv.ParseUint(lo, 10, 64)
			b, errB := strconv.ParseUint(hi, 10, 64)
			if errA != nil || errB != nil || a > b {
				return "", fmt.Errorf("%q is not an ascending range", item)
			}
		}
		if i == 0 {
			first = lo
		}
	}
	return first, nil
}

func digits(s string) bool {
	return s != "" && strings.TrimLeft(s, "0123456789") == ""
}
