package tokenizer

import (
	"unicode"
	"unicode/utf8"
)

// pattern names one of the split regexes that have a hand-written matcher.
// Go's regexp has no look-ahead, which \s+(?!\S) needs, and a matcher that
// knows its pattern runs several times faster than any regex engine.
type pattern uint8

const (
	patGPT2 pattern = iota + 1
	patLlama3
	patQwen2
)

func (p pattern) String() string {
	switch p {
	case patGPT2:
		return "gpt2"
	case patLlama3:
		return "llama3"
	case patQwen2:
		return "qwen2"
	}
	return "none"
}

// next returns the end of the pre-token that starts at b[i] (i < len(b)).
func (p pattern) next(b []byte, i int) int {
	switch p {
	case patGPT2:
		return nextGPT2(b, i)
	case patLlama3:
		return nextCL(b, i, 3)
	default:
		return nextCL(b, i, 1)
	}
}

// Character classes as the patterns see them. Every character is exactly
// one of letter (\p{L}), number (\p{N}), space (\s) or symbol (the rest).
// A byte that is not valid UTF-8 is a symbol, as U+FFFD would be, so text
// with broken encoding still splits the way its lossy decoding would.
const (
	clsSym uint8 = iota
	clsLetter
	clsNumber
	clsSpace
)

var asciiClass [128]uint8

func init() {
	for c := rune(0); c < 128; c++ {
		asciiClass[c] = runeClass(c)
	}
}

// runeClass classifies a character. \s is Unicode's White_Space, as in the
// Rust regex engines behind HF tokenizers and tiktoken (it includes U+0085
// and not U+FEFF; JavaScript's \s has it the other way round).
func runeClass(r rune) uint8 {
	switch {
	case unicode.IsLetter(r):
		return clsLetter
	case unicode.IsNumber(r):
		return clsNumber
	case unicode.IsSpace(r):
		return clsSpace
	}
	return clsSym
}

// classAt returns the class and byte length of the character at b[i].
func classAt(b []byte, i int) (uint8, int) {
	if c := b[i]; c < utf8.RuneSelf {
		return asciiClass[c], 1
	}
	r, n := utf8.DecodeRune(b[i:])
	if n == 1 {
		return clsSym, 1
	}
	return runeClass(r), n
}

// runEnd returns the end of the run of class cl that starts at b[i].
func runEnd(b []byte, i int, cl uint8) int {
	for i < len(b) {
		if c := b[i]; c < utf8.RuneSelf {
			if asciiClass[c] != cl {
				return i
			}
			i++
			continue
		}
		k, n := classAt(b, i)
		if k != cl {
			return i
		}
		i += n
	}
	return i
}

// nextGPT2 matches
//
//	's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//
// with a backtracking engine's leftmost-first choice among alternatives.
func nextGPT2(b []byte, i int) int {
	n := len(b)
	c := b[i]
	if c == '\'' && i+1 < n {
		switch b[i+1] {
		case 's', 't', 'm', 'd':
			return i + 2
		case 'r', 'v':
			if i+2 < n && b[i+2] == 'e' {
				return i + 3
			}
		case 'l':
			if i+2 < n && b[i+2] == 'l' {
				return i + 3
			}
		}
	}
	j := i
	if c == ' ' && i+1 < n {
		j = i + 1 // the optional space of the next three alternatives
	}
	if cl, sz := classAt(b, j); cl != clsSpace {
		return runEnd(b, j+sz, cl)
	}
	return spaceEnd(b, i)
}

// spaceEnd matches \s+(?!\S)|\s+ at a space: a run that reaches the end of
// the text is taken whole; one followed by other text gives up its last
// character (which then leads the next pre-token), unless it is that one
// character alone.
func spaceEnd(b []byte, i int) int {
	j, last := i, i
	for j < len(b) {
		cl, sz := classAt(b, j)
		if cl != clsSpace {
			break
		}
		last = j
		j += sz
	}
	if j == len(b) || last == i {
		return j
	}
	return last
}

// nextCL matches the Llama 3 pattern (maxDigits 3)
//
//	(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//
// or Qwen 2's, which is the same with \p{N} (maxDigits 1).
func nextCL(b []byte, i int, maxDigits int) int {
	n := len(b)
	c := b[i]
	if c == '\'' {
		if k := contraction(b[i+1:]); k > 0 {
			return i + 1 + k
		}
	}
	cl, sz := classAt(b, i)
	switch cl {
	case clsLetter:
		return runEnd(b, i+sz, clsLetter)
	case clsNumber:
		j := i + sz
		for k := 1; k < maxDigits && j < n; k++ {
			cl2, sz2 := classAt(b, j)
			if cl2 != clsNumber {
				break
			}
			j += sz2
		}
		return j
	}
	// A symbol or a space other than \r and \n may lead a run of letters.
	if c != '\r' && c != '\n' && i+sz < n {
		if cl2, sz2 := classAt(b, i+sz); cl2 == clsLetter {
			return runEnd(b, i+sz+sz2, clsLetter)
		}
	}
	if cl == clsSym {
		return newlinesEnd(b, runEnd(b, i+sz, clsSym))
	}
	if c == ' ' && i+1 < n {
		if cl2, sz2 := classAt(b, i+1); cl2 == clsSym {
			return newlinesEnd(b, runEnd(b, i+1+sz2, clsSym))
		}
	}
	// \s*[\r\n]+ takes the run up to and including its last \r or \n;
	// without one, \s+(?!\S)|\s+ as in GPT-2.
	j, last, nl := i, i, -1
	for j < n {
		cl2, sz2 := classAt(b, j)
		if cl2 != clsSpace {
			break
		}
		if b[j] == '\r' || b[j] == '\n' {
			nl = j + 1
		}
		last = j
		j += sz2
	}
	switch {
	case nl > 0:
		return nl
	case j == n || last == i:
		return j
	}
	return last
}

// newlinesEnd skips [\r\n]*.
func newlinesEnd(b []byte, i int) int {
	for i < len(b) && (b[i] == '\r' || b[i] == '\n') {
		i++
	}
	return i
}

// contraction matches (?i:s|t|re|ve|m|ll|d) at the start of b (just after an
// apostrophe) and returns its length, or 0. Case-insensitive matching in
// the Rust engines folds U+017F (ſ, long s) to s, so it counts too.
func contraction(b []byte) int {
	if len(b) == 0 {
		return 0
	}
	switch b[0] | 0x20 {
	case 's', 't', 'm', 'd':
		return 1
	case 'r', 'v':
		if len(b) > 1 && b[1]|0x20 == 'e' {
			return 2
		}
	case 'l':
		if len(b) > 1 && b[1]|0x20 == 'l' {
			return 2
		}
	}
	if len(b) > 1 && b[0] == 0xC5 && b[1] == 0xBF {
		return 2
	}
	return 0
}
