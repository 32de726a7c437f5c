package tokenizer

import (
	"bytes"
	"unicode"
	"unicode/utf8"
)

// trie finds added tokens in text: leftmost match first and, among matches
// starting there, the longest (aho-corasick's LeftmostLongest, as HF uses).
// Most text holds none of the tokens' first bytes, so the scan jumps from
// one candidate byte to the next.
type trie struct {
	edges map[uint32]int32 // node<<8 | byte -> child node
	term  []int32          // node -> index into Tokenizer.added, or -1
	first [256]bool
	// only is the one byte every token starts with, or -1.
	only int
}

// newTrie builds a matcher for pats; idx[i] is the added-token index pats[i]
// stands for. A pattern listed twice keeps its last index. It returns nil
// when there is nothing to match.
func newTrie(pats []string, idx []int) *trie {
	if len(pats) == 0 {
		return nil
	}
	tr := &trie{edges: make(map[uint32]int32), term: []int32{-1}, only: -1}
	firsts := 0
	for i, p := range pats {
		node := int32(0)
		for j := 0; j < len(p); j++ {
			k := uint32(node)<<8 | uint32(p[j])
			child, ok := tr.edges[k]
			if !ok {
				child = int32(len(tr.term))
				tr.term = append(tr.term, -1)
				tr.edges[k] = child
			}
			node = child
		}
		tr.term[node] = int32(idx[i])
		if !tr.first[p[0]] {
			tr.first[p[0]] = true
			firsts++
			tr.only = int(p[0])
		}
	}
	if firsts != 1 {
		tr.only = -1
	}
	return tr
}

// longest returns the end of the longest pattern that starts at text[i]
// and its index, or -1.
func (tr *trie) longest(text []byte, i int) (end int, idx int32) {
	end, idx = -1, -1
	node := int32(0)
	for j := i; j < len(text); j++ {
		child, ok := tr.edges[uint32(node)<<8|uint32(text[j])]
		if !ok {
			break
		}
		node = child
		if t := tr.term[node]; t >= 0 {
			end, idx = j+1, t
		}
	}
	return end, idx
}

// find returns the leftmost-longest match at or after from.
func (tr *trie) find(text []byte, from int) (start, end int, idx int32, ok bool) {
	for i := from; i < len(text); i++ {
		if tr.only >= 0 {
			k := bytes.IndexByte(text[i:], byte(tr.only))
			if k < 0 {
				return 0, 0, -1, false
			}
			i += k
		} else if !tr.first[text[i]] {
			continue
		}
		if e, t := tr.longest(text, i); t >= 0 {
			return i, e, t, true
		}
	}
	return 0, 0, -1, false
}

// nextAdded returns the next added token in text at or after from, with
// the whitespace its lstrip/rstrip flags swallow: text[start:end] is
// replaced by the token's id. prevEnd is where the previous token ended;
// lstrip never reaches back past it. A single_word token with a word
// character on either side is skipped, as HF skips it.
func (t *Tokenizer) nextAdded(tr *trie, text []byte, from, prevEnd int) (start, end int, id int32, ok bool) {
	for from < len(text) {
		s, e, idx, found := tr.find(text, from)
		if !found {
			return 0, 0, -1, false
		}
		a := &t.added[idx]
		if a.singleWord && (endsWithWord(text[:s]) || startsWithWord(text[e:])) {
			from = e
			continue
		}
		if a.lstrip {
			ls := s
			for ls > prevEnd {
				r, n := utf8.DecodeLastRune(text[:ls])
				if n == 1 && r == utf8.RuneError || !unicode.IsSpace(r) {
					break
				}
				ls -= n
			}
			s = ls
		}
		if a.rstrip {
			for e < len(text) {
				r, n := utf8.DecodeRune(text[e:])
				if n == 1 && r == utf8.RuneError || !unicode.IsSpace(r) {
					break
				}
				e += n
			}
		}
		return s, e, a.id, true
	}
	return 0, 0, -1, false
}

// isWordRune approximates the Unicode \w of Rust's regex crate: alphabetic,
// marks, decimal digits, connector punctuation and the joiners.
func isWordRune(r rune) bool {
	return unicode.IsLetter(r) || unicode.IsMark(r) || unicode.Is(unicode.Nd, r) ||
		unicode.Is(unicode.Nl, r) || unicode.Is(unicode.Pc, r) || unicode.Is(unicode.Other_Alphabetic, r) ||
		r == 0x200C || r == 0x200D
}

func endsWithWord(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	r, n := utf8.DecodeLastRune(b)
	return !(n == 1 && r == utf8.RuneError) && isWordRune(r)
}

func startsWithWord(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	r, n := utf8.DecodeRune(b)
	return !(n == 1 && r == utf8.RuneError) && isWordRune(r)
}
