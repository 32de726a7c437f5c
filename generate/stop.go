package generate

import "strings"

// StopAt reports where text must be cut for the first stop string it
// contains: the index of the earliest occurrence of any of stops (the
// stop string itself is not kept), and whether one occurs. Empty stop
// strings are ignored: they would occur everywhere and stop before the
// first byte.
//
// The earliest occurrence wins whichever stop string it belongs to, so the
// order of stops does not matter and overlapping stop strings cut at the
// first byte any of them covers.
func StopAt(text string, stops []string) (int, bool) {
	at, found := len(text), false
	for _, s := range stops {
		if s == "" {
			continue
		}
		// Only an occurrence that starts before the best so far can
		// improve it, so search just the text that could hold one.
		if i := strings.Index(text[:min(len(text), at+len(s)-1)], s); i >= 0 && i < at {
			at, found = i, true
		}
	}
	if !found {
		return 0, false
	}
	return at, true
}

// Holdback is how many bytes at the end of text may still become the
// start of a stop string once more text arrives: a streaming printer holds
// them back instead of printing them, so that it never prints the head of
// a stop string it later has to cut. It is the length of the longest
// suffix of text that is a proper prefix of some stop string (a whole stop
// string is StopAt's to find). Bytes, not runes, are compared, so a stop
// string's first bytes are held back even when they end text in the
// middle of a multi-byte character.
func Holdback(text string, stops []string) int {
	held := 0
	for _, s := range stops {
		for n := min(len(text), len(s)-1); n > held; n-- {
			if strings.HasSuffix(text, s[:n]) {
				held = n
				break
			}
		}
	}
	return held
}
