package generate

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestStopAt(t *testing.T) {
	for _, tc := range []struct {
		name  string
		text  string
		stops []string
		at    int
		found bool
	}{
		{"none given", "hello", nil, 0, false},
		{"absent", "hello world", []string{"xyz"}, 0, false},
		{"empty text", "", []string{"a"}, 0, false},
		{"empty stops ignored", "hello", []string{"", ""}, 0, false},
		{"empty among others", "hello\n\nbye", []string{"", "\n\n"}, 5, true},
		{"at the start", "###rest", []string{"###"}, 0, true},
		{"at the end", "done.</s>", []string{"</s>"}, 5, true},
		{"the first occurrence", "a.b.c", []string{"."}, 1, true},
		{"earliest of several, listed later", "one END two STOP", []string{"STOP", "END"}, 4, true},
		{"overlapping: the longer starts first", "xabcd", []string{"bcd", "abc"}, 1, true},
		{"overlapping: one inside another", "xxabcx", []string{"abc", "b"}, 2, true},
		{"overlapping: same start", "say hello", []string{"hello", "hell"}, 4, true},
		{"self-overlapping", "xaaab", []string{"aab"}, 2, true},
		{"whole text", "stop", []string{"stop"}, 0, true},
		{"longer than text", "st", []string{"stop"}, 0, false},
		{"multi-byte", "naïve café — fin", []string{"café"}, 7, true},
		{"multi-byte dash", "a — b", []string{"—"}, 2, true},
		{"CJK", "你好。再见", []string{"。"}, 6, true},
		{"emoji", "ok 👍 done", []string{"👍"}, 3, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			at, found := StopAt(tc.text, tc.stops)
			assert.Equal(t, tc.found, found)
			assert.Equal(t, tc.at, at)
		})
	}
}

func TestHoldback(t *testing.T) {
	for _, tc := range []struct {
		name  string
		text  string
		stops []string
		want  int
	}{
		{"none given", "hello", nil, 0},
		{"empty stop", "hello", []string{""}, 0},
		{"empty text", "", []string{"abc"}, 0},
		{"no prefix at the end", "hello", []string{"abc"}, 0},
		{"one byte", "hello <", []string{"</s>"}, 1},
		{"two bytes", "hello </", []string{"</s>"}, 2},
		{"proper prefix only", "hello </s", []string{"</s>"}, 3},
		{"a whole stop is not held", "hello </s>", []string{"</s>"}, 0},
		{"a whole one-byte stop is not held", "ab.", []string{"."}, 0},
		{"longest suffix", "xaa", []string{"aab"}, 2},
		{"shorter when the longer fails", "xba", []string{"aab"}, 1},
		{"text shorter than the prefix", "a", []string{"aab"}, 1},
		{"the longest across stops", "x\n\n#", []string{"#", "\n\n##", "#!"}, 3},
		{"prefix not at the end", "<x", []string{"<s>"}, 0},
		{"multi-byte: first byte of é", "caf\xc3", []string{"é!"}, 1},
		{"multi-byte: whole rune", "café", []string{"é!"}, 2},
		{"CJK partial", "你好\xe3\x80", []string{"。"}, 2},
		{"CJK prefix of a longer stop", "你好。再", []string{"。再见"}, 6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, Holdback(tc.text, tc.stops))
		})
	}
}

// Streaming with Holdback prints exactly the text before the stop, however
// the text is split into pieces.
func TestStreamingWithHoldback(t *testing.T) {
	full := "Answer: 42 — done.<|end|>ignored"
	stops := []string{"<|end|>", "—!"}
	want := full[:strings.Index(full, "<|end|>")]
	for chunk := 1; chunk <= 8; chunk++ {
		var printed, text string
		stopped := false
		for i := 0; i < len(full) && !stopped; i += chunk {
			text += full[i:min(i+chunk, len(full))]
			end := len(text) - Holdback(text, stops)
			if at, ok := StopAt(text, stops); ok {
				end, stopped = at, true
			}
			printed += text[len(printed):end]
		}
		assert.True(t, stopped, "chunk %d", chunk)
		assert.Equal(t, want, printed, "chunk %d", chunk)
	}
}
