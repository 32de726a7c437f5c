package tokenizer

import (
	"encoding/json"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestNFC compares the NFC normalizer with ICU's (testdata/nfc.json, written
// by testdata/gen/gen.js): every character NFC changes on its own, and
// random strings of composites, marks of many classes and Hangul jamo.
func TestNFC(t *testing.T) {
	data, err := os.ReadFile("testdata/nfc.json")
	require.NoError(t, err)
	var cases [][2]string
	require.NoError(t, json.Unmarshal(data, &cases))
	require.Greater(t, len(cases), 5000)
	var runes []rune
	bad := 0
	for _, c := range cases {
		got := string(nfcAppend(nil, []byte(c[0]), &runes))
		if got != c[1] {
			bad++
			if bad <= 20 {
				t.Errorf("NFC(%+q) = %+q, want %+q", c[0], got, c[1])
			}
		}
	}
	assert.Zero(t, bad)
}

func TestNFCBytes(t *testing.T) {
	var runes []rune
	tests := []struct{ in, want string }{
		{"", ""},
		{"plain ASCII stays", "plain ASCII stays"},
		{"cafe\u0301", "caf\u00e9"},
		{"e\xff\u0301", "e\xff\u0301"}, // an invalid byte is a starter: nothing composes across it
		{"\u0301e", "\u0301e"},         // a leading mark stays
		{"\u1100\u1161\u11a8x", "\uac01x"},
		{"q\u0307\u0323", "q\u0323\u0307"},
		{"\u212b\u2126", "\u00c5\u03a9"},
	}
	for _, tc := range tests {
		assert.Equal(t, tc.want, string(nfcAppend(nil, []byte(tc.in), &runes)), "%+q", tc.in)
	}
	src := []byte("no change here: \u00e9\u4e2d\U0001F600")
	assert.Equal(t, src, nfcAppend(nil, src, &runes))
}
