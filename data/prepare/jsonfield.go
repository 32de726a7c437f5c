package prepare

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"
)

// lineStatus is what a JSON Lines line yielded.
type lineStatus uint8

const (
	lineOK        lineStatus = iota // a string under the key
	lineNotJSON                     // not valid JSON
	lineNotObject                   // valid JSON, but not an object
	lineNoKey                       // an object without the key
	lineNotString                   // the key holds a number, null, an array or an object
	lineNotUTF8                     // the string under the key holds bytes that are not UTF-8
	lineSurrogate                   // the string under the key escapes half of a surrogate pair alone
)

// jsonField is the string under key in line, a JSON object, as
// encoding/json would decode it into a map (the last of duplicate keys
// wins). Bytes in the string that are not UTF-8 make the line bad, as
// Python's strict decoding in Megatron-LM's preprocessing refuses them,
// rather than text silently changed to U+FFFD. It validates the line once and then
// walks only its top level, copying nothing when the value has no escapes:
// decoding every line into a map would cost more than tokenizing it.
func jsonField(line []byte, key string) ([]byte, lineStatus) {
	if !json.Valid(line) {
		return nil, lineNotJSON
	}
	i := skipSpace(line, 0)
	if i >= len(line) || line[i] != '{' {
		return nil, lineNotObject
	}
	vStart, vEnd := -1, -1
	i = skipSpace(line, i+1)
	for i < len(line) && line[i] == '"' {
		kEnd := stringEnd(line, i)
		match := keyEquals(line[i:kEnd], key)
		i = skipSpace(line, kEnd)
		i = skipSpace(line, i+1) // past ':'
		end := valueEnd(line, i)
		if match {
			vStart, vEnd = i, end
		}
		i = skipSpace(line, end)
		if i < len(line) && line[i] == ',' {
			i = skipSpace(line, i+1)
		}
	}
	if vStart < 0 {
		return nil, lineNoKey
	}
	if line[vStart] != '"' {
		return nil, lineNotString
	}
	raw := line[vStart+1 : vEnd-1]
	if !utf8.Valid(raw) {
		return nil, lineNotUTF8
	}
	if bytes.IndexByte(raw, '\\') < 0 {
		return raw, lineOK
	}
	if loneSurrogate(raw) {
		// encoding/json would decode it to U+FFFD in silence: text as
		// broken as bytes that are not UTF-8.
		return nil, lineSurrogate
	}
	var s string
	if err := json.Unmarshal(line[vStart:vEnd], &s); err != nil {
		return nil, lineNotJSON // unreachable for a line json.Valid accepted
	}
	return []byte(s), lineOK
}

// loneSurrogate says whether raw, a JSON string's contents, escapes a
// UTF-16 surrogate that is not half of a pair (\ud800 alone), which
// stands for no character. Python's json keeps it in the str, and a
// Hugging Face tokenizer then refuses the text.
func loneSurrogate(raw []byte) bool {
	hex4 := func(i int) (rune, bool) {
		if i+6 > len(raw) || raw[i] != '\\' || raw[i+1] != 'u' {
			return 0, false
		}
		var r rune
		for _, c := range raw[i+2 : i+6] {
			var d byte
			switch {
			case c >= '0' && c <= '9':
				d = c - '0'
			case c >= 'a' && c <= 'f':
				d = c - 'a' + 10
			case c >= 'A' && c <= 'F':
				d = c - 'A' + 10
			default:
				return 0, false
			}
			r = r<<4 | rune(d)
		}
		return r, true
	}
	for i := 0; i < len(raw); {
		if raw[i] != '\\' {
			i++
			continue
		}
		r, ok := hex4(i)
		switch {
		case !ok:
			i += 2 // another escape
		case r >= 0xD800 && r <= 0xDBFF:
			if lo, ok := hex4(i + 6); !ok || lo < 0xDC00 || lo > 0xDFFF {
				return true
			}
			i += 12
		case r >= 0xDC00 && r <= 0xDFFF:
			return true
		default:
			i += 6
		}
	}
	return false
}

// keyEquals says whether quoted, a JSON string with its quotes, is key.
func keyEquals(quoted []byte, key string) bool {
	raw := quoted[1 : len(quoted)-1]
	if bytes.IndexByte(raw, '\\') < 0 && utf8.Valid(raw) {
		return string(raw) == key
	}
	var s string
	return json.Unmarshal(quoted, &s) == nil && s == key
}

func skipSpace(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// stringEnd is the index just past the JSON string starting at b[i] == '"'.
func stringEnd(b []byte, i int) int {
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			j++
		case '"':
			return j + 1
		}
	}
	return len(b)
}

// valueEnd is the index just past the JSON value starting at b[i], in a
// document already known to be valid.
func valueEnd(b []byte, i int) int {
	if i >= len(b) {
		return i
	}
	switch b[i] {
	case '"':
		return stringEnd(b, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				j = stringEnd(b, j) - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1
				}
			}
		}
		return len(b)
	}
	for j := i; j < len(b); j++ {
		switch b[j] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return j
		}
	}
	return len(b)
}

// describe says what is wrong with a line, for the error that stops a run.
func (s lineStatus) describe(key string) string {
	switch s {
	case lineNotJSON:
		return "not valid JSON"
	case lineNotObject:
		return "not a JSON object"
	case lineNoKey:
		return "no " + quote(key) + " key"
	case lineNotString:
		return "the " + quote(key) + " value is not a string"
	case lineNotUTF8:
		return "the " + quote(key) + " value holds bytes that are not UTF-8 (save the file as UTF-8)"
	case lineSurrogate:
		return "the " + quote(key) + " value escapes half of a UTF-16 surrogate pair alone (\\ud800 with no \\udc00–\\udfff after it, or the second half alone), which is no character"
	}
	return "fine"
}

func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
