package tokenizer

import "math/bits"

// noMerge is what mergeTable.get returns for a pair that never merges. It
// is larger than any packed rank, so a scan for the lowest rank skips it.
const noMerge = ^uint64(0)

// mergeTable maps a pair of ids to rank<<32 | merged id, with open
// addressing on uint64 keys: a lookup is a multiply and, nearly always, one
// probe, which matters because merging a word costs a lookup per pair.
type mergeTable struct {
	keys  []uint64
	vals  []uint64
	shift uint
	n     int
}

const emptyKey = ^uint64(0) // ids are below maxID, so no pair packs to this

func newMergeTable(n int) mergeTable {
	size := 16
	for size < 2*n {
		size *= 2
	}
	m := mergeTable{keys: make([]uint64, size), vals: make([]uint64, size), shift: uint(64 - bits.TrailingZeros(uint(size)))}
	for i := range m.keys {
		m.keys[i] = emptyKey
	}
	return m
}

func pairKey(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

func (m *mergeTable) slot(k uint64) uint64 { return (k * 0x9E3779B97F4A7C15) >> m.shift }

// put sets a pair's rank and result; a later put of the same pair wins, as
// a pair listed twice does in HF's merge map.
func (m *mergeTable) put(a, b int32, rank uint32, merged int32) {
	k := pairKey(a, b)
	mask := uint64(len(m.keys) - 1)
	for h := m.slot(k); ; h = (h + 1) & mask {
		switch m.keys[h] {
		case emptyKey:
			m.keys[h] = k
			m.n++
			fallthrough
		case k:
			m.vals[h] = uint64(rank)<<32 | uint64(uint32(merged))
			return
		}
	}
}

func (m *mergeTable) get(a, b int32) uint64 {
	k := pairKey(a, b)
	mask := uint64(len(m.keys) - 1)
	for h := m.slot(k); ; h = (h + 1) & mask {
		switch m.keys[h] {
		case k:
			return m.vals[h]
		case emptyKey:
			return noMerge
		}
	}
}

// Words up to smallWord symbols are merged by rescanning an array of pair
// ranks, which beats a heap at these sizes; longer ones (long runs of
// spaces or symbols, a SentencePiece text without spaces) use the heap so
// that a megabyte-long word stays O(n log n).
const smallWord = 64

// merge applies the merges to syms in place and returns the merged ids.
// Each step merges the pair of lowest rank, the leftmost of equal ones:
// the order HF's BPE uses.
func (t *Tokenizer) merge(st *encState, syms []int32) []int32 {
	if len(syms) < 2 {
		return syms
	}
	if len(syms) > smallWord {
		return t.mergeLong(st, syms)
	}
	return t.mergeSmall(st, syms)
}

// mergeSmall is merge for words of at most smallWord symbols (any length
// works; it is quadratic).
func (t *Tokenizer) mergeSmall(st *encState, syms []int32) []int32 {
	n := len(syms)
	if len(st.pairs) < n {
		st.pairs = make([]uint64, n)
	}
	pr := st.pairs[:n-1]
	for i := 0; i < n-1; i++ {
		pr[i] = t.merges.get(syms[i], syms[i+1])
	}
	for n > 1 {
		best, at := noMerge, -1
		for i, v := range pr[:n-1] {
			if v < best {
				best, at = v, i
			}
		}
		if at < 0 {
			break
		}
		syms[at] = int32(uint32(best))
		copy(syms[at+1:], syms[at+2:n])
		copy(pr[at:], pr[at+1:n-1])
		n--
		if at > 0 {
			pr[at-1] = t.merges.get(syms[at-1], syms[at])
		}
		if at < n-1 {
			pr[at] = t.merges.get(syms[at], syms[at+1])
		}
	}
	return syms[:n]
}

// mergeLong is merge for long words: a doubly linked list of symbols and a
// binary min-heap of rank<<32 | position. Entries go stale as their
// symbols merge; a popped entry is used only if its pair still has that
// rank, and since a rank names one pair that check is exact.
func (t *Tokenizer) mergeLong(st *encState, syms []int32) []int32 {
	n := len(syms)
	if cap(st.prev) < n {
		st.prev = make([]int32, n)
		st.next = make([]int32, n)
	}
	prev, next := st.prev[:n], st.next[:n]
	h := st.heap[:0]
	for i := range syms {
		prev[i] = int32(i - 1)
		next[i] = int32(i + 1)
	}
	next[n-1] = -1
	for i := 0; i < n-1; i++ {
		if v := t.merges.get(syms[i], syms[i+1]); v != noMerge {
			h = heapPush(h, v&^0xFFFFFFFF|uint64(i))
		}
	}
	for len(h) > 0 {
		var top uint64
		top, h = heapPop(h)
		i := int32(uint32(top))
		if syms[i] < 0 {
			continue
		}
		j := next[i]
		if j < 0 {
			continue
		}
		v := t.merges.get(syms[i], syms[j])
		if v == noMerge || v>>32 != top>>32 {
			continue
		}
		syms[i] = int32(uint32(v))
		syms[j] = -1
		next[i] = next[j]
		if next[j] >= 0 {
			prev[next[j]] = i
		}
		if p := prev[i]; p >= 0 {
			if v := t.merges.get(syms[p], syms[i]); v != noMerge {
				h = heapPush(h, v&^0xFFFFFFFF|uint64(p))
			}
		}
		if q := next[i]; q >= 0 {
			if v := t.merges.get(syms[i], syms[q]); v != noMerge {
				h = heapPush(h, v&^0xFFFFFFFF|uint64(i))
			}
		}
	}
	st.heap = h
	out := 0
	for i := int32(0); i >= 0; i = next[i] {
		syms[out] = syms[i]
		out++
	}
	return syms[:out]
}

func heapPush(h []uint64, v uint64) []uint64 {
	h = append(h, v)
	for i := len(h) - 1; i > 0; {
		p := (i - 1) / 2
		if h[p] <= h[i] {
			break
		}
		h[p], h[i] = h[i], h[p]
		i = p
	}
	return h
}

func heapPop(h []uint64) (uint64, []uint64) {
	top := h[0]
	last := len(h) - 1
	h[0] = h[last]
	h = h[:last]
	for i := 0; ; {
		l := 2*i + 1
		if l >= len(h) {
			break
		}
		m := l
		if r := l + 1; r < len(h) && h[r] < h[l] {
			m = r
		}
		if h[i] <= h[m] {
			break
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
	return top, h
}

// The word cache maps a pre-token's bytes to its ids. Natural text repeats
// its words, so most pre-tokens skip merging altogether. Each encState
// (one per concurrent Encode) has its own, so there is no locking; it is
// emptied when full, which keeps memory bounded and the common words come
// straight back.
const (
	cacheWords   = 1 << 16
	cacheMaxWord = 512 // bytes; longer words are rare and seldom repeat
)

// encState is the scratch space of one Encode call, reused across calls.
type encState struct {
	cache  map[string]uint64 // word -> offset<<32 | count in arena
	arena  []int32
	syms   []int32
	pairs  []uint64
	prev   []int32
	next   []int32
	heap   []uint64
	norm   [2][]byte
	meta   []byte
	runes  []rune
	prefix [maxSteps][]byte
}

func newEncState() *encState {
	return &encState{
		cache: make(map[string]uint64, 1024),
		syms:  make([]int32, 0, 256),
		pairs: make([]uint64, smallWord),
	}
}

// getState takes a state from the tokenizer's free list. A channel rather
// than a sync.Pool keeps the caches alive across garbage collections.
func (t *Tokenizer) getState() *encState {
	select {
	case st := <-t.states:
		return st
	default:
		return newEncState()
	}
}

func (t *Tokenizer) putState(st *encState) {
	select {
	case t.states <- st:
	default:
	}
}

func (st *encState) lookup(w []byte) ([]int32, bool) {
	v, ok := st.cache[string(w)]
	if !ok {
		return nil, false
	}
	off := v >> 32
	return st.arena[off : off+v&0xFFFFFFFF], true
}

func (st *encState) store(w []byte, ids []int32) {
	if len(st.cache) >= cacheWords {
		clear(st.cache)
		st.arena = st.arena[:0]
	}
	st.cache[string(w)] = uint64(len(st.arena))<<32 | uint64(len(ids))
	st.arena = append(st.arena, ids...)
}

// encodeWord appends the ids of one byte-level pre-token.
func (t *Tokenizer) encodeWord(st *encState, dst []int32, w []byte) []int32 {
	switch len(w) {
	case 0:
		return dst
	case 1:
		if id := t.byteIDs[w[0]]; id >= 0 {
			dst = append(dst, id)
		}
		return dst
	}
	cacheable := len(w) <= cacheMaxWord
	if cacheable {
		if ids, ok := st.lookup(w); ok {
			return append(dst, ids...)
		}
	}
	if t.ignoreMerges {
		if id, ok := t.vocab[string(w)]; ok {
			if cacheable {
				one := [1]int32{id}
				st.store(w, one[:])
			}
			return append(dst, id)
		}
	}
	syms := st.syms[:0]
	for _, c := range w {
		if id := t.byteIDs[c]; id >= 0 {
			syms = append(syms, id)
		}
	}
	syms = t.merge(st, syms)
	st.syms = syms[:0]
	if cacheable {
		st.store(w, syms)
	}
	return append(dst, syms...)
}
