package prepare

import (
	"encoding/json"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
)

func TestJSONField(t *testing.T) {
	tests := []struct {
		line   string
		want   string
		status lineStatus
	}{
		{`{"text": "plain"}`, "plain", lineOK},
		{` { "a" : 1 , "text" : "spaced" } `, "spaced", lineOK},
		{`{"a": {"text": "inner"}, "b": [1, {"text": "x"}, "]"], "text": "outer"}`, "outer", lineOK},
		{`{"text": "a\"b\\c\n\u00e9\ud83d\ude00"}`, "a\"b\\c\né😀", lineOK},
		{`{"text": "one", "text": "two"}`, "two", lineOK},
		{`{"te\u0078t": "escaped key"}`, "escaped key", lineOK},
		{`{"Text": "case matters"}`, "", lineNoKey},
		{"{\"text\": \"bad utf8 \xff\"}", "", lineNotUTF8},
		{"{\"text\": \"escaped \\n then bad \xc3\"}", "", lineNotUTF8},
		{"{\"other\": \"\xff\", \"text\": \"fine\"}", "fine", lineOK},
		{`{"text": "a\ud800b"}`, "", lineSurrogate},
		{`{"text": "\udc00"}`, "", lineSurrogate},
		{`{"text": "\ud800\u0041"}`, "", lineSurrogate},
		{`{"text": "\ud83d\ude00\ud800"}`, "", lineSurrogate},
		{`{"text": "\\ud800 is written, not escaped"}`, `\ud800 is written, not escaped`, lineOK},
		{`{"other": "\ud800", "text": "fine"}`, "fine", lineOK},
		{`{"text": ""}`, "", lineOK},
		{`{}`, "", lineNoKey},
		{`{"text": 1}`, "", lineNotString},
		{`{"text": null}`, "", lineNotString},
		{`{"text": ["a"]}`, "", lineNotString},
		{`{"text": {"a": "b"}}`, "", lineNotString},
		{`{"text": true}`, "", lineNotString},
		{`["text", "a"]`, "", lineNotObject},
		{`"text"`, "", lineNotObject},
		{`{"text": "a"`, "", lineNotJSON},
		{`{"text": "a"} {"text": "b"}`, "", lineNotJSON},
		{``, "", lineNotJSON},
		{`{text: "a"}`, "", lineNotJSON},
	}
	for _, tc := range tests {
		t.Run(tc.line, func(t *testing.T) {
			got, status := jsonField([]byte(tc.line), "text")
			assert.Equal(t, tc.status, status)
			assert.Equal(t, tc.want, string(got))
			assert.NotEmpty(t, status.describe("text"))
		})
	}
}

// FuzzJSONField: the fast field lookup agrees with encoding/json decoding
// the line into a map, and never panics.
func FuzzJSONField(f *testing.F) {
	for _, s := range []string{
		`{"text": "plain"}`, `{"a": [1, "}", {"text": 2}], "text": "x\u0041"}`, `{"text": null}`,
		`{"text": "a", "text": 3}`, `[]`, `{"te\"xt": "q"}`, "{\"text\": \"\xc3\"}", `{"text":"\\"}`,
	} {
		f.Add([]byte(s), "text")
	}
	f.Fuzz(func(t *testing.T, line []byte, key string) {
		got, status := jsonField(line, key)
		var m map[string]json.RawMessage
		if err := json.Unmarshal(line, &m); err != nil || m == nil {
			if status == lineOK || status == lineNoKey || status == lineNotString {
				t.Fatalf("%q: status %d, but encoding/json cannot decode it into a map (%v)", line, status, err)
			}
			return
		}
		raw, ok := m[key]
		if !ok {
			if status != lineNoKey {
				t.Fatalf("%q: status %d, want no key", line, status)
			}
			return
		}
		if raw[0] == '"' && !utf8.Valid(raw) {
			if status != lineNotUTF8 {
				t.Fatalf("%q: status %d, want not UTF-8", line, status)
			}
			return
		}
		if raw[0] == '"' && loneSurrogate(raw[1:len(raw)-1]) {
			if status != lineSurrogate {
				t.Fatalf("%q: status %d, want a lone surrogate", line, status)
			}
			return
		}
		var s string
		if err := json.Unmarshal(raw, &s); err != nil || string(raw) == "null" {
			if status != lineNotString {
				t.Fatalf("%q: status %d, want not a string", line, status)
			}
			return
		}
		if status != lineOK || string(got) != s {
			t.Fatalf("%q: got %q (status %d), want %q", line, got, status, s)
		}
	})
}
