package sample

import (
	"math"
	"testing"
)

// The parsers take user input: whatever it is, they answer without
// panicking, and what they accept is well formed.

func FuzzParseSplit(f *testing.F) {
	for _, s := range []string{"98,2", "969,30,1", "1/1", "", ",", "-0,1", "1e308,1e308", "0x1p3,1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		w, err := ParseSplit(s)
		if err != nil {
			return
		}
		sum := 0.0
		for _, v := range w {
			if v < 0 || math.IsNaN(v) {
				t.Fatalf("%q gave weight %v", s, v)
			}
			sum += v
		}
		if math.Abs(sum-1) > 1e-9 {
			t.Fatalf("%q gave weights summing to %v", s, sum)
		}
		for _, docs := range []int{0, 1, 7, 1000} {
			prev := 0
			for _, r := range SplitRanges(docs, w) {
				if r[0] != prev || r[1] < r[0] || r[1] > docs {
					t.Fatalf("%q over %d documents: ranges %v", s, docs, SplitRanges(docs, w))
				}
				prev = r[1]
			}
			if prev != docs {
				t.Fatalf("%q over %d documents leaves some out: %v", s, docs, SplitRanges(docs, w))
			}
		}
	})
}

func FuzzParseBlend(f *testing.F) {
	for _, s := range []string{"A", "0.3 A 0.7 B", "0.3 A 0.7", "A B", "1e308 A 1e308 B", "-0 A 1 B"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		parts, err := ParseBlend(s)
		if err != nil {
			return
		}
		sum := 0.0
		for _, p := range parts {
			if p.Prefix == "" || p.Weight < 0 || math.IsNaN(p.Weight) {
				t.Fatalf("%q gave %+v", s, parts)
			}
			sum += p.Weight
		}
		if math.Abs(sum-1) > 1e-9 {
			t.Fatalf("%q gave weights summing to %v", s, sum)
		}
	})
}
