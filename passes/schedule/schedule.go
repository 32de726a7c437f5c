package schedule

import (
	"bufio"
	"fmt"
	"strconv"
	"strings"
)

// Schedule is one pipeline step for every rank. Ranks, Chunks and Micro are
// p (pipeline ranks), v (model chunks per rank) and m (microbatches); the
// model has p·v chunks in all. Actions[r] is rank r's list in execution
// order, transfers included, ending with one GradSync and one Optim.
type Schedule struct {
	Name    string
	Ranks   int
	Chunks  int
	Micro   int
	Actions [][]Action
}

// RankOf is the interleaved placement rule (chunk j on rank j mod p). Every
// consumer of a schedule must agree on it, so it lives here rather than being
// recomputed ad hoc.
func (s *Schedule) RankOf(chunk int) int {
	return chunk % s.Ranks
}

// numChunks is p·v, the number of chunks the model is cut into.
func (s *Schedule) numChunks() int { return s.Ranks * s.Chunks }

// String prints the header and one line per rank, the form Parse reads.
func (s *Schedule) String() string {
	var b strings.Builder
	n := 0
	for _, acts := range s.Actions {
		n += 16 + 10*len(acts)
	}
	b.Grow(64 + n)
	fmt.Fprintf(&b, "schedule %s p=%d v=%d m=%d\n", s.Name, s.Ranks, s.Chunks, s.Micro)
	buf := make([]byte, 0, 32)
	for r, acts := range s.Actions {
		b.WriteString("rank ")
		b.WriteString(strconv.Itoa(r))
		b.WriteByte(':')
		for _, a := range acts {
			buf = appendAction(append(buf[:0], ' '), a)
			b.Write(buf)
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// Parse reads the text form written by String. It checks only syntax and the
// header/rank-line structure; whether the schedule can run is Validate's and
// Simulate's business, so a deliberately broken schedule can still be loaded
// and diagnosed. Blank lines and lines starting with '#' are skipped.
func Parse(text string) (*Schedule, error) {
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 0, 64*1024), len(text)+1)
	var s *Schedule
	line := 0
	for sc.Scan() {
		line++
		raw := strings.TrimSpace(sc.Text())
		if raw == "" || raw[0] == '#' {
			continue
		}
		if s == nil {
			h, err := parseHeader(raw)
			if err != nil {
				return nil, fmt.Errorf("%w: line %d: %w", ErrParse, line, err)
			}
			s = h
			continue
		}
		r := len(s.Actions)
		rest, ok := strings.CutPrefix(raw, "rank ")
		if !ok {
			return nil, fmt.Errorf("%w: line %d: expected \"rank %d:\", got %q", ErrParse, line, r, firstField(raw))
		}
		num, body, ok := strings.Cut(rest, ":")
		if !ok || strings.TrimSpace(num) != strconv.Itoa(r) {
			return nil, fmt.Errorf("%w: line %d: expected \"rank %d:\" (ranks must be listed in order), got %q", ErrParse, line, r, "rank "+num+":")
		}
		if r >= s.Ranks {
			return nil, fmt.Errorf("%w: line %d: rank %d listed but the header says p=%d", ErrParse, line, r, s.Ranks)
		}
		toks := strings.Fields(body)
		acts := make([]Action, 0, len(toks))
		for i, tok := range toks {
			a, err := parseAction(tok)
			if err != nil {
				return nil, fmt.Errorf("%w: line %d (rank %d), token %d %q: %w", ErrParse, line, r, i+1, tok, err)
			}
			acts = append(acts, a)
		}
		s.Actions = append(s.Actions, acts)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: line %d: %w", ErrParse, line+1, err)
	}
	if s == nil {
		return nil, fmt.Errorf("%w: empty input: expected header \"schedule NAME p=P v=V m=M\"", ErrParse)
	}
	if len(s.Actions) != s.Ranks {
		return nil, fmt.Errorf("%w: header says p=%d but %d rank lines follow", ErrParse, s.Ranks, len(s.Actions))
	}
	return s, nil
}

// parseHeader reads "schedule NAME p=P v=V m=M".
func parseHeader(line string) (*Schedule, error) {
	f := strings.Fields(line)
	if len(f) != 5 || f[0] != "schedule" {
		return nil, fmt.Errorf("expected header \"schedule NAME p=P v=V m=M\", got %q", line)
	}
	s := &Schedule{Name: f[1]}
	for i, key := range []string{"p", "v", "m"} {
		tok := f[2+i]
		val, ok := strings.CutPrefix(tok, key+"=")
		if !ok {
			return nil, fmt.Errorf("header token %d %q: expected %s=N", 3+i, tok, key)
		}
		n, err := strconv.Atoi(val)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("header token %d %q: %s must be a positive integer", 3+i, tok, key)
		}
		switch key {
		case "p":
			s.Ranks = n
		case "v":
			s.Chunks = n
		case "m":
			s.Micro = n
		}
	}
	s.Actions = make([][]Action, 0, min(s.Ranks, 1024)) // the header is not trusted with an allocation
	return s, nil
}

func firstField(s string) string {
	if f := strings.Fields(s); len(f) > 0 {
		return f[0]
	}
	return s
}
