package sample

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseSplit(t *testing.T) {
	tests := []struct {
		in   string
		want []float64
		err  error
		msg  string
	}{
		{in: "98,2", want: []float64{0.98, 0.02, 0}},
		{in: "969,30,1", want: []float64{0.969, 0.03, 0.001}},
		{in: " 1 , 1 ", want: []float64{0.5, 0.5, 0}},
		{in: "949/50/1", want: []float64{0.949, 0.05, 0.001}},
		{in: "100", want: []float64{1, 0, 0}},
		{in: "0,1", want: []float64{0, 1, 0}},
		{in: "1e308,1e308", want: []float64{0.5, 0.5, 0}},
		{in: "98,-2", err: ErrSplitNegative},
		{in: "98,x", err: ErrSplitNotNumber},
		{in: "98,,2", err: ErrSplitNotNumber},
		{in: "", err: ErrSplitNotNumber},
		{in: "NaN,1", err: ErrSplitNotNumber},
		{in: "Inf,1", err: ErrSplitNotNumber},
		{in: "1e400,1", err: ErrSplitNotNumber, msg: `part 1 of "1e400,1" is "1e400", past a float64's range`},
		{in: "0,0,0", err: ErrSplitZero},
		{in: "1,1,1,1", err: ErrSplitParts},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseSplit(tc.in)
			if tc.err != nil {
				require.ErrorIs(t, err, tc.err)
				assert.Contains(t, err.Error(), "e.g.", "the error says how to fix it")
				assert.Contains(t, err.Error(), tc.msg)
				return
			}
			require.NoError(t, err)
			require.Len(t, got, 3)
			assert.InDeltaSlice(t, tc.want, got, 1e-15)
		})
	}
}

// TestSplitRanges checks the bookends against values worked by hand from
// Megatron's formula: normalise, sum cumulatively, int(round(c*N)) with
// Python's round (halves to even).
func TestSplitRanges(t *testing.T) {
	tests := []struct {
		split string
		docs  int
		want  [][2]int
	}{
		// 0.98*1000 = 980.
		{"98,2", 1000, [][2]int{{0, 980}, {980, 1000}, {1000, 1000}}},
		// 0.969*1234 = 1195.746 -> 1196; 0.999*1234 = 1232.766 -> 1233.
		{"969,30,1", 1234, [][2]int{{0, 1196}, {1196, 1233}, {1233, 1234}}},
		// 0.5*5 = 2.5 rounds to even: 2 (half-up would give 3).
		{"1,1", 5, [][2]int{{0, 2}, {2, 5}, {5, 5}}},
		// 0.5*7 = 3.5 rounds to even: 4.
		{"1,1", 7, [][2]int{{0, 4}, {4, 7}, {7, 7}}},
		// 0.75*6 = 4.5 -> 4.
		{"3,1", 6, [][2]int{{0, 4}, {4, 6}, {6, 6}}},
		// 0.25*10 = 2.5 -> 2; 0.5*10 = 5. (Megatron's older
		// get_train_valid_test_split_ shifted these to 3, 5.)
		{"1,1,2", 10, [][2]int{{0, 2}, {2, 5}, {5, 10}}},
		// 0.9*3 = 2.7 -> 3: the held-out split is empty.
		{"9,1", 3, [][2]int{{0, 3}, {3, 3}, {3, 3}}},
		// A zero first part: no training documents.
		{"0,1", 10, [][2]int{{0, 0}, {0, 10}, {10, 10}}},
		{"98,2", 0, [][2]int{{0, 0}, {0, 0}, {0, 0}}},
		// 1/3 each: 3.333 -> 3, 6.667 -> 7.
		{"1,1,1", 10, [][2]int{{0, 3}, {3, 7}, {7, 10}}},
	}
	for _, tc := range tests {
		w, err := ParseSplit(tc.split)
		require.NoError(t, err)
		assert.Equal(t, tc.want, SplitRanges(tc.docs, w), "%s of %d", tc.split, tc.docs)
	}
	// Raw weights are normalised as Megatron does; bad ones give empty
	// ranges, never a panic.
	assert.Equal(t, [][2]int{{0, 980}, {980, 1000}}, SplitRanges(1000, []float64{98, 2}))
	assert.Equal(t, [][2]int{{0, 0}, {0, 0}}, SplitRanges(10, []float64{0, 0}))
	assert.Equal(t, [][2]int{{0, 0}, {0, 10}}, SplitRanges(10, []float64{-1, 1}))
	assert.Equal(t, [][2]int{{0, 0}}, SplitRanges(-5, []float64{1}))
}
