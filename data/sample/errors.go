package sample

import (
	"errors"

	"gcompile/data"
)

// The split string's faults are told apart so that the CLI can point at the
// part of --split to fix.
var (
	// ErrSplitNotNumber is a part of the split string that is not a finite
	// number.
	ErrSplitNotNumber = errors.New("split part is not a number")
	// ErrSplitNegative is a split part below zero.
	ErrSplitNegative = errors.New("split part is negative")
	// ErrSplitZero is a split whose parts are all zero, which leaves
	// nothing to train on.
	ErrSplitZero = errors.New("split parts are all zero")
	// ErrSplitParts is a split of more than train, held-out and test.
	ErrSplitParts = errors.New("split has more than 3 parts")
)

// The blend string's faults are told apart so that the CLI can point at the
// word of --data to fix.
var (
	// ErrBlendEmpty is a blend that names no dataset.
	ErrBlendEmpty = errors.New("blend names no dataset")
	// ErrBlendWeight is a word in a weight's place that is not a finite
	// number.
	ErrBlendWeight = errors.New("blend weight is not a number")
	// ErrBlendNegative is a weight below zero.
	ErrBlendNegative = errors.New("blend weight is negative")
	// ErrBlendZero is a blend whose weights sum to zero.
	ErrBlendZero = errors.New("blend weights sum to zero")
	// ErrBlendPrefix is a weight with no dataset prefix after it.
	ErrBlendPrefix = errors.New("blend weight has no dataset after it")
	// ErrBlendOdd is a blend of more than one word whose words do not pair
	// up as weight and prefix.
	ErrBlendOdd = errors.New("blend words do not pair up as weight and prefix")
	// ErrBlendParts is a blend whose datasets cannot be blended: counts of
	// weights and datasets that differ, a missing dataset, or datasets cut
	// into windows of different lengths.
	ErrBlendParts = errors.New("blend datasets do not match")
	// ErrBlendTwice is a dataset a blend names twice.
	ErrBlendTwice = errors.New("blend names a dataset twice")
)

// Faults of the samples themselves.
var (
	// ErrSeq is a sequence length that is not positive, or not the one the
	// samples were built for.
	ErrSeq = errors.New("wrong sequence length")
	// ErrRange is a document range outside the dataset.
	ErrRange = errors.New("document range outside the dataset")
	// ErrTooSmall is a split with fewer than seq+1 tokens: not one sample
	// fits. It wraps data.ErrTooSmall, so callers that handle a too-small
	// corpus handle this too.
	ErrTooSmall error = &childErr{"split too small for one sample", data.ErrTooSmall}
	// ErrDst is a destination whose length is not seq+1.
	ErrDst = errors.New("destination is not seq+1 tokens long")
	// ErrSampleNumber is a negative sample number, or one too large to
	// address.
	ErrSampleNumber = errors.New("sample number out of range")
	// ErrDataset is a dataset that reports impossible sizes (negative
	// document lengths, too many tokens to address).
	ErrDataset = errors.New("token dataset reports impossible sizes")
	// ErrCorrupt is an index whose content does not fit the dataset: after
	// a rebuild it means the dataset changed without its Identity changing.
	ErrCorrupt = errors.New("sample index does not fit the dataset")
	// ErrCache is a cache folder that cannot be written.
	ErrCache = errors.New("sample index cache cannot be written")
	// ErrNoHeldOut is an evaluation asked of data without a held-out split.
	ErrNoHeldOut = errors.New("no held-out split")
	// ErrBatch is a step, batch or evaluation index that is out of range.
	ErrBatch = errors.New("batch out of range")
	// ErrTokenID is a drawn id past the ids the data was described with
	// (Dataset.LimitIDs).
	ErrTokenID = errors.New("token id past the data's description")
)

// childErr is a sentinel that is also one of another package's, so
// errors.Is finds both.
type childErr struct {
	msg    string
	parent error
}

func (e *childErr) Error() string { return e.msg }
func (e *childErr) Unwrap() error { return e.parent }
