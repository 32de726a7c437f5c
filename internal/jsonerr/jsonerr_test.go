package jsonerr

import (
	"encoding/json"
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDecode(t *testing.T) {
	type inner struct {
		Step int `json:"step"`
	}
	type doc struct {
		Version int      `json:"version"`
		Scale   *float64 `json:"scale"`
		State   inner    `json:"state"`
		Files   map[string]string
	}
	for _, tc := range []struct{ name, text, want string }{
		{"a string for an int", `{"version": "1"}`, "version is a JSON string, want a whole number"},
		{"a nested key", `{"state": {"step": "2"}}`, "state.step is a JSON string, want a whole number"},
		{"a fraction for an int", `{"state": {"step": 2.5}}`, "state.step is 2.5, want a whole number"},
		{"out of range", `{"state": {"step": 1e30}}`, "state.step is 1e30, want a whole number"},
		{"a list for the document", `[]`, "the file is a JSON array, want a JSON object"},
		{"a byte-order mark", "\xef\xbb\xbf{}", "the file starts with a UTF-8 byte-order mark"},
		{"empty", " \n", "the file is empty"},
		{"cut short", `{"version": 1`, "the JSON ends before it is complete (is the file cut short?)"},
		{"not JSON", "{\n  version: 1}", "not JSON at line 2, column 3: invalid character 'v'"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var d doc
			err := json.Unmarshal([]byte(tc.text), &d)
			require.Error(t, err)
			got := Decode([]byte(tc.text), err)
			assert.Contains(t, got.Error(), tc.want)
			assert.NotContains(t, got.Error(), "Go struct")
			assert.ErrorIs(t, got, err, "the decoder's error stays beneath")
		})
	}
	assert.Equal(t, io.EOF, Value(io.EOF), "an error of another kind is returned as it is")
}
