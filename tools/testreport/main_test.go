package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A skip is listed with its reason, a failure with its output, a pass
// with one line, and a failure makes the exit status say so.
func TestReportListsSkipsAndFailures(t *testing.T) {
	in := `{"Action":"run","Package":"p","Test":"TestA"}
{"Action":"output","Package":"p","Test":"TestA","Output":"=== RUN   TestA\n"}
{"Action":"output","Package":"p","Test":"TestA","Output":"    a_test.go:9: no GPU on this machine\n"}
{"Action":"output","Package":"p","Test":"TestA","Output":"--- SKIP: TestA (0.00s)\n"}
{"Action":"skip","Package":"p","Test":"TestA"}
{"Action":"output","Package":"p","Test":"TestB","Output":"    b_test.go:3: wrong answer\n"}
{"Action":"fail","Package":"p","Test":"TestB"}
{"Action":"output","Package":"p","Test":"TestC","Output":"noise\n"}
{"Action":"pass","Package":"p","Test":"TestC"}
{"Action":"fail","Package":"p","Elapsed":1.5}
{"Action":"pass","Package":"q","Elapsed":0.25}
{"Action":"skip","Package":"r"}
`
	var out strings.Builder
	failed, err := report(strings.NewReader(in), &out)
	require.NoError(t, err)
	assert.True(t, failed)
	assert.Equal(t, "    b_test.go:3: wrong answer\nFAIL\tp\t1.500s\nok  \tq\t0.250s\n?   \tr\t[no test files]\nSKIP p TestA: a_test.go:9: no GPU on this machine\n", out.String())

	out.Reset()
	failed, err = report(strings.NewReader(`{"Action":"pass","Package":"q","Elapsed":0.25}`+"\n"), &out)
	require.NoError(t, err)
	assert.False(t, failed)
}

// A binary that dies with tests still running (go test -timeout's panic)
// fails its package only: the unfinished tests' output, where the panic
// and the running tests' names are, is shown with it.
func TestReportShowsTestsThatDidNotFinish(t *testing.T) {
	in := `{"Action":"run","Package":"p","Test":"TestSlow"}
{"Action":"output","Package":"p","Test":"TestSlow","Output":"=== RUN   TestSlow\n"}
{"Action":"output","Package":"p","Test":"TestSlow","Output":"panic: test timed out after 15m0s\n"}
{"Action":"output","Package":"p","Test":"TestSlow","Output":"\trunning tests:\n\t\tTestSlow (14m59s)\n"}
{"Action":"output","Package":"q","Test":"TestOther","Output":"=== RUN   TestOther\n"}
{"Action":"fail","Package":"p","Elapsed":900.1}
`
	var out strings.Builder
	failed, err := report(strings.NewReader(in), &out)
	require.NoError(t, err)
	assert.True(t, failed)
	assert.Equal(t, "--- did not finish: TestSlow\n=== RUN   TestSlow\npanic: test timed out after 15m0s\n\trunning tests:\n\t\tTestSlow (14m59s)\nFAIL\tp\t900.100s\n", out.String())
}
