package tokenizer

import (
	"sort"
	"sync"
	"unicode/utf8"
)

//go:generate sh -c "cd testdata/gen && node nfcgen.js && gofmt -w ../../nfc_tables.go"

// NFC (canonical decomposition, then canonical composition) is the
// normalizer of Qwen's tokenizers. The Unicode data comes from
// nfc_tables.go; the algorithm is UAX #15's. Only the stretches around
// characters that NFC can change are normalized: before any other
// character (a starter that composes with nothing before it and is its
// own NFC) the text can be cut without changing the result.

type nfcData struct {
	decomp map[rune][]rune
	pairs  map[uint64]rune
}

var nfcTables = sync.OnceValue(func() *nfcData {
	d := &nfcData{decomp: make(map[rune][]rune, 2100), pairs: make(map[uint64]rune, len(nfcPairs)/3)}
	for i := 0; i < len(nfcDecompositions); {
		cp := nfcDecompositions[i]
		j := i + 1
		for nfcDecompositions[j] != 0 {
			j++
		}
		d.decomp[cp] = nfcDecompositions[i+1 : j]
		i = j + 1
	}
	for i := 0; i+2 < len(nfcPairs); i += 3 {
		d.pairs[uint64(nfcPairs[i])<<32|uint64(nfcPairs[i+1])] = nfcPairs[i+2]
	}
	return d
})

// Hangul syllables decompose and compose by arithmetic.
const (
	hangulS0, hangulL0, hangulV0, hangulT0 = 0xAC00, 0x1100, 0x1161, 0x11A7
	hangulLN, hangulVN, hangulTN           = 19, 21, 28
	hangulNN                               = hangulVN * hangulTN
	hangulSN                               = hangulLN * hangulNN
)

// rawByte marks, in the rune buffer, a byte that is not valid UTF-8: it
// goes through NFC untouched, as a starter that composes with nothing.
const rawByte = 0x110000

func inRanges(r rune, ranges []rune, stride int) int {
	n := len(ranges) / stride
	i := sort.Search(n, func(i int) bool { return ranges[i*stride+1] >= r })
	if i < n && ranges[i*stride] <= r {
		return i
	}
	return -1
}

// nfcUnstable says whether NFC may change r or join it to what precedes it.
func nfcUnstable(r rune) bool {
	return r >= nfcUnstableRanges[0] && inRanges(r, nfcUnstableRanges[:], 2) >= 0
}

// combiningRank is the rank of r's canonical combining class, 0 for
// starters; ranks order as the classes do.
func combiningRank(r rune) int {
	if r < nfcClassRanges[0] || r >= rawByte {
		return 0
	}
	if i := inRanges(r, nfcClassRanges[:], 3); i >= 0 {
		return int(nfcClassRanges[3*i+2])
	}
	return 0
}

// nfcAppend appends the NFC form of src to dst; buf is scratch space.
// Bytes that are not valid UTF-8 are kept as they are.
func nfcAppend(dst, src []byte, buf *[]rune) []byte {
	copied, safe := 0, 0 // src[:copied] is in dst; src[safe] starts a stable character
	for i := 0; i < len(src); {
		r, n := rune(src[i]), 1
		if r >= utf8.RuneSelf {
			r, n = utf8.DecodeRune(src[i:])
		}
		if r < utf8.RuneSelf || (n == 1 && r == utf8.RuneError) || !nfcUnstable(r) {
			safe = i
			i += n
			continue
		}
		// Normalize from the stable character before this one (a starter it
		// may compose with) to the next stable character.
		j := i + n
		for j < len(src) {
			r2, n2 := utf8.DecodeRune(src[j:])
			if r2 < utf8.RuneSelf || (n2 == 1 && r2 == utf8.RuneError) || !nfcUnstable(r2) {
				break
			}
			j += n2
		}
		dst = append(dst, src[copied:safe]...)
		dst = nfcSpan(dst, src[safe:j], buf)
		copied, safe, i = j, j, j
	}
	return append(dst, src[copied:]...)
}

// nfcSpan appends the NFC form of s: decompose, reorder marks by class,
// compose.
func nfcSpan(dst, s []byte, buf *[]rune) []byte {
	tab := nfcTables()
	b := (*buf)[:0]
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRune(s[i:])
		if n == 1 && r == utf8.RuneError {
			r = rawByte + rune(s[i])
		}
		i += n
		switch {
		case r >= hangulS0 && r < hangulS0+hangulSN:
			k := r - hangulS0
			b = append(b, hangulL0+k/hangulNN, hangulV0+(k%hangulNN)/hangulTN)
			if t := k % hangulTN; t != 0 {
				b = append(b, hangulT0+t)
			}
		default:
			if d, ok := tab.decomp[r]; ok {
				b = append(b, d...)
			} else {
				b = append(b, r)
			}
		}
	}
	// Canonical order: a stable insertion sort of each run of marks.
	for i := 1; i < len(b); i++ {
		c := combiningRank(b[i])
		if c == 0 {
			continue
		}
		for j := i; j > 0 && combiningRank(b[j-1]) > c; j-- {
			b[j-1], b[j] = b[j], b[j-1]
		}
	}
	// Canonical composition.
	if len(b) > 0 {
		starter, w := 0, 1
		last := combiningRank(b[0])
		if last != 0 {
			last = 256 // a leading mark: nothing before it to compose with
		}
		for i := 1; i < len(b); i++ {
			r := b[i]
			c := combiningRank(r)
			if p, ok := compose(tab, b[starter], r); ok && (last < c || last == 0) {
				b[starter] = p
				continue
			}
			if c == 0 {
				starter = w
			}
			last = c
			b[w] = r
			w++
		}
		b = b[:w]
	}
	for _, r := range b {
		if r >= rawByte {
			dst = append(dst, byte(r-rawByte))
		} else {
			dst = utf8.AppendRune(dst, r)
		}
	}
	*buf = b
	return dst
}

// compose returns the primary composite of a starter and the character
// after it, if there is one.
func compose(tab *nfcData, a, b rune) (rune, bool) {
	if a >= hangulL0 && a < hangulL0+hangulLN && b >= hangulV0 && b < hangulV0+hangulVN {
		return hangulS0 + ((a-hangulL0)*hangulVN+(b-hangulV0))*hangulTN, true
	}
	if a >= hangulS0 && a < hangulS0+hangulSN && (a-hangulS0)%hangulTN == 0 && b > hangulT0 && b < hangulT0+hangulTN {
		return a + (b - hangulT0), true
	}
	if a >= rawByte || b >= rawByte {
		return 0, false
	}
	p, ok := tab.pairs[uint64(a)<<32|uint64(b)]
	return p, ok
}
