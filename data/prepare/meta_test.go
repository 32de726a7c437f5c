package prepare

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestReadMeta(t *testing.T) {
	dir := t.TempDir()
	writeTree(t, dir, map[string]string{"a.txt": "some text"})
	prefix := filepath.Join(dir, "out")
	_, err := Run(context.Background(), byteEncoder{}, Options{Inputs: []string{filepath.Join(dir, "a.txt")}, OutputPrefix: prefix, AppendEOS: true, Tokenizer: "fp"})
	require.NoError(t, err)
	good, err := os.ReadFile(prefix + ".json")
	require.NoError(t, err)
	edit := func(f func(m map[string]any)) string {
		var m map[string]any
		require.NoError(t, json.Unmarshal(good, &m))
		f(m)
		b, err := json.Marshal(m)
		require.NoError(t, err)
		return string(b)
	}
	tests := []struct {
		name     string
		json     *string // nil: no file
		setup    func(t *testing.T)
		ok       bool
		want     error
		contains []string
	}{
		{name: "ours", json: ptr(string(good)), ok: true},
		{name: "no file", json: nil},
		{name: "another tool's JSON", json: ptr(`{"tokenizer": "gpt2", "documents": 5}`)},
		{name: "JSON Lines", json: ptr("{\"text\": \"a\"}\n{\"text\": \"b\"}\n")},
		{name: "not JSON", json: ptr("hello"), want: ErrMeta,
			contains: []string{"is not a readable dataset record (invalid character 'h'", "prepare the dataset again, or remove the file"}},
		{name: "cut short", json: ptr(string(good[:40])), want: ErrMeta,
			contains: []string{"is not a readable dataset record (unexpected EOF)", "without the tokenizer check"}},
		{name: "garbage after a brace", json: ptr("{garbage\n"), want: ErrMeta, contains: []string{"is not a readable dataset record"}},
		{name: "newer version", json: ptr(edit(func(m map[string]any) { m["version"] = 2 })), want: ErrMeta,
			contains: []string{"version 2", "update gcompile"}},
		{name: "version 0", json: ptr(edit(func(m map[string]any) { m["version"] = 0 })), want: ErrMeta, contains: []string{"version 0"}},
		{name: "unknown dtype", json: ptr(edit(func(m map[string]any) { m["dtype"] = "bfloat16" })), want: ErrMeta, contains: []string{"bfloat16", "delete it"}},
		{name: "max token past the vocabulary", json: ptr(edit(func(m map[string]any) { m["max_token"] = 300 })), want: ErrMeta,
			contains: []string{"max_token 300", "vocab_size 257"}},
		{name: "a vocabulary past 2^24", json: ptr(edit(func(m map[string]any) { m["vocab_size"] = 99999999999 })), want: ErrMeta,
			contains: []string{"vocab_size 99999999999, want 0 (unknown) to 16777216"}},
		{name: "a negative vocabulary", json: ptr(edit(func(m map[string]any) { m["vocab_size"] = -5 })), want: ErrMeta, contains: []string{"vocab_size -5"}},
		{name: "max token past its dtype", json: ptr(edit(func(m map[string]any) { m["max_token"], m["vocab_size"] = 70000, 80000 })), want: ErrMeta,
			contains: []string{"max_token 70000 cannot be stored as its dtype uint16 (at most 65535)"}},
		{name: "stale", json: ptr(edit(func(m map[string]any) { m["bin_bytes"] = 4 })), want: ErrMeta,
			contains: []string{"describes a .bin of 4 bytes", "out.bin has 20", "rewritten after it was prepared"}},
		{name: "dataset gone", json: ptr(string(good)), setup: func(t *testing.T) { require.NoError(t, os.Remove(prefix+".idx")) }, want: ErrMeta,
			contains: []string{"out.idx", "no such file"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			p := filepath.Join(dir, "out")
			for _, ext := range []string{".bin", ".idx"} {
				b, err := os.ReadFile(prefix + ext)
				require.NoError(t, err)
				require.NoError(t, os.WriteFile(p+ext, b, 0o644))
			}
			if tc.json != nil {
				require.NoError(t, os.WriteFile(p+".json", []byte(*tc.json), 0o644))
			}
			old := prefix
			prefix = p
			defer func() { prefix = old }()
			if tc.setup != nil {
				tc.setup(t)
			}
			m, ok, err := ReadMeta(p)
			assert.Equal(t, tc.ok, ok)
			if tc.want == nil {
				require.NoError(t, err)
				if ok {
					assert.Equal(t, "fp", m.Tokenizer)
					assert.Equal(t, int64(1), m.Documents)
					assert.Equal(t, int32(256), m.MaxToken)
				}
				return
			}
			require.ErrorIs(t, err, tc.want)
			for _, s := range tc.contains {
				assert.Contains(t, err.Error(), s)
			}
			assert.True(t, strings.HasPrefix(err.Error(), p+".json"), err.Error())
		})
	}
}

func ptr[T any](v T) *T { return &v }
