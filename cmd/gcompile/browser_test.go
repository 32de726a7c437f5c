package main

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The browser tests drive a headless Chromium over the DevTools protocol
// on a pipe (--remote-debugging-pipe: JSON messages ended by a NUL byte,
// Chromium reading on its fd 3 and writing on its fd 4), which needs no
// port, no WebSocket and no library beyond encoding/json.

// findChromium is the browser to drive, or "" with the reason there is
// none. GCOMPILE_CHROMIUM names one outside PATH.
func findChromium() (string, string) {
	if p := os.Getenv("GCOMPILE_CHROMIUM"); p != "" {
		if _, err := exec.LookPath(p); err != nil {
			return "", fmt.Sprintf("GCOMPILE_CHROMIUM=%s: %v", p, err)
		}
		return p, ""
	}
	names := []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome-headless-shell"}
	for _, name := range names {
		if p, err := exec.LookPath(name); err == nil {
			return p, ""
		}
	}
	return "", "no headless Chromium on PATH (" + strings.Join(names, ", ") + "; Debian: apt-get install chromium)"
}

// needChromium returns the browser, or skips the test, unless
// GCOMPILE_REQUIRE_CHROMIUM=1 (CI, which installs it) makes a missing
// browser a failure: a skipped check there would pass unseen.
func needChromium(t skipper) string {
	t.Helper()
	p, why := findChromium()
	if p != "" {
		return p
	}
	if os.Getenv("GCOMPILE_REQUIRE_CHROMIUM") == "1" {
		t.Fatalf("GCOMPILE_REQUIRE_CHROMIUM=1 but %s", why)
		return ""
	}
	t.Skip(why + "; set GCOMPILE_REQUIRE_CHROMIUM=1 to make this a failure")
	return ""
}

// browser is one Chromium process and one page (tab) in it.
type browser struct {
	cmd     *exec.Cmd
	in      *os.File // Chromium's fd 3: commands go here
	session string   // the page's flat-mode session id

	mu      sync.Mutex
	next    int
	replies map[int]chan cdpMessage
	events  chan cdpMessage
	closed  chan struct{} // closed when the reader ends
	readErr error
	stderr  *lockedBuffer
}

type cdpMessage struct {
	ID        int             `json:"id,omitempty"`
	Method    string          `json:"method,omitempty"`
	Params    json.RawMessage `json:"params,omitempty"`
	SessionID string          `json:"sessionId,omitempty"`
	Result    json.RawMessage `json:"result,omitempty"`
	Error     *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error,omitempty"`
}

// startBrowser starts Chromium and opens a blank page; t's cleanup stops
// it. It may run on a goroutine of its own, so it returns its error
// rather than end the test.
func startBrowser(t *testing.T, path string) (*browser, error) {
	cmdR, cmdW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	args := []string{"--headless", "--disable-gpu", "--remote-debugging-pipe", "--user-data-dir=" + t.TempDir(),
		"--no-first-run", "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
		"--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio", "--force-device-scale-factor=1", "about:blank"}
	if os.Geteuid() == 0 {
		// Chromium refuses to run its sandbox as root (CI containers).
		args = append([]string{"--no-sandbox"}, args...)
	}
	b := &browser{in: cmdW, replies: map[int]chan cdpMessage{}, events: make(chan cdpMessage, 1024),
		closed: make(chan struct{}), stderr: &lockedBuffer{}}
	b.cmd = exec.Command(path, args...)
	b.cmd.ExtraFiles = []*os.File{cmdR, outW}
	b.cmd.Stderr = b.stderr
	// A group of its own: Chromium's renderer and GPU processes go with
	// it if it has to be killed.
	b.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err = b.cmd.Start()
	cmdR.Close()
	outW.Close()
	if err != nil {
		cmdW.Close()
		outR.Close()
		return nil, err
	}
	go b.read(outR)
	t.Cleanup(func() {
		b.in.Close() // Chromium exits when its pipe closes
		done := make(chan struct{})
		go func() { b.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			syscall.Kill(-b.cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
	})

	var target struct {
		TargetID string `json:"targetId"`
	}
	if err := b.callErr("", "Target.createTarget", map[string]any{"url": "about:blank"}, &target); err != nil {
		return nil, err
	}
	var attached struct {
		SessionID string `json:"sessionId"`
	}
	if err := b.callErr("", "Target.attachToTarget", map[string]any{"targetId": target.TargetID, "flatten": true}, &attached); err != nil {
		return nil, err
	}
	b.session = attached.SessionID
	return b, b.callErr(b.session, "Page.enable", nil, nil)
}

// lockedBuffer holds Chromium's stderr, for messages, while it writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (b *browser) read(r io.ReadCloser) {
	defer r.Close()
	br := bufio.NewReaderSize(r, 1<<20)
	for {
		raw, err := br.ReadBytes(0)
		if err != nil {
			b.mu.Lock()
			b.readErr = err
			b.mu.Unlock()
			close(b.closed)
			return
		}
		var m cdpMessage
		if json.Unmarshal(raw[:len(raw)-1], &m) != nil {
			continue
		}
		if m.ID != 0 {
			b.mu.Lock()
			ch := b.replies[m.ID]
			delete(b.replies, m.ID)
			b.mu.Unlock()
			if ch != nil {
				ch <- m
			}
			continue
		}
		select {
		case b.events <- m:
		default: // events nobody waits for are dropped rather than block replies
		}
	}
}

// browserTimeout bounds every exchange: a page that hangs the browser
// fails the test instead of the test binary's deadline.
const browserTimeout = 20 * time.Second

// call sends one command and decodes its result into out (when not nil).
func (b *browser) call(t *testing.T, session, method string, params any, out any) {
	t.Helper()
	require.NoError(t, b.callErr(session, method, params, out), "%s", method)
}

func (b *browser) callErr(session, method string, params any, out any) error {
	b.mu.Lock()
	b.next++
	id := b.next
	ch := make(chan cdpMessage, 1)
	b.replies[id] = ch
	b.mu.Unlock()
	msg := map[string]any{"id": id, "method": method}
	if params != nil {
		msg["params"] = params
	}
	if session != "" {
		msg["sessionId"] = session
	}
	raw, err := json.Marshal(msg)
	if err != nil {
		return err
	}
	if _, err := b.in.Write(append(raw, 0)); err != nil {
		return fmt.Errorf("writing to Chromium: %w (stderr: %s)", err, b.stderrText())
	}
	select {
	case m := <-ch:
		if m.Error != nil {
			return fmt.Errorf("%s: %s (%d)", method, m.Error.Message, m.Error.Code)
		}
		if out != nil {
			return json.Unmarshal(m.Result, out)
		}
		return nil
	case <-b.closed:
		return fmt.Errorf("Chromium closed its pipe (%v); stderr: %s", b.readErr, b.stderrText())
	case <-time.After(browserTimeout):
		return fmt.Errorf("no reply in %v", browserTimeout)
	}
}

func (b *browser) stderrText() string { return b.stderr.String() }

// load shows url in a viewport width×height and waits for its load event.
func (b *browser) load(t *testing.T, url string, width, height int) {
	t.Helper()
	b.call(t, b.session, "Emulation.setDeviceMetricsOverride",
		map[string]any{"width": width, "height": height, "deviceScaleFactor": 1, "mobile": false}, nil)
	// Events of an earlier page must not pass for this one's.
	for len(b.events) > 0 {
		<-b.events
	}
	var nav struct {
		ErrorText string `json:"errorText"`
	}
	b.call(t, b.session, "Page.navigate", map[string]any{"url": url}, &nav)
	require.Empty(t, nav.ErrorText, "navigating to %s", url)
	ctx, cancel := context.WithTimeout(context.Background(), browserTimeout)
	defer cancel()
	for {
		select {
		case m := <-b.events:
			if m.Method == "Page.loadEventFired" && m.SessionID == b.session {
				return
			}
		case <-ctx.Done():
			t.Fatalf("%s did not load in %v", url, browserTimeout)
		}
	}
}

// eval runs a JavaScript expression that returns a JSON string and
// decodes it into out.
func (b *browser) eval(t *testing.T, expr string, out any) {
	t.Helper()
	var r struct {
		Result struct {
			Type  string          `json:"type"`
			Value json.RawMessage `json:"value"`
		} `json:"result"`
		Exception *struct {
			Text      string `json:"text"`
			Exception struct {
				Description string `json:"description"`
			} `json:"exception"`
		} `json:"exceptionDetails"`
	}
	b.call(t, b.session, "Runtime.evaluate", map[string]any{"expression": expr, "returnByValue": true}, &r)
	if r.Exception != nil {
		t.Fatalf("script failed: %s %s", r.Exception.Text, r.Exception.Exception.Description)
	}
	var s string
	require.NoError(t, json.Unmarshal(r.Result.Value, &s), "the script returns a JSON string, got %s", r.Result.Value)
	require.NoError(t, json.Unmarshal([]byte(s), out))
}

// screenshot writes the whole page (up to maxShotH pixels tall) as a PNG.
func (b *browser) screenshot(t *testing.T, path string, width int) {
	t.Helper()
	var lm struct {
		Content struct {
			Height float64 `json:"height"`
		} `json:"cssContentSize"`
	}
	b.call(t, b.session, "Page.getLayoutMetrics", nil, &lm)
	const maxShotH = 8000
	h := min(max(lm.Content.Height, 1), maxShotH)
	var shot struct {
		Data string `json:"data"`
	}
	b.call(t, b.session, "Page.captureScreenshot", map[string]any{"format": "png", "captureBeyondViewport": true,
		"clip": map[string]any{"x": 0, "y": 0, "width": width, "height": h, "scale": 1}}, &shot)
	png, err := base64.StdEncoding.DecodeString(shot.Data)
	require.NoError(t, err)
	require.Greater(t, len(png), 1000, "an empty screenshot")
	require.NoError(t, os.WriteFile(path, png, 0o644))
}

// layout is what layoutJS measures of a page.
type layout struct {
	ScrollWidth float64   `json:"scrollWidth"`
	Viewport    float64   `json:"viewport"`
	Overflows   []overrun `json:"overflows"`
	Plots       []plot    `json:"plots"`
	Text        string    `json:"text"`
	// Scrolled are the boxes (class scroll) whose content is wider than
	// they are: shown only in part until scrolled sideways.
	Scrolled []string `json:"scrolled"`
}

// overrun is an element that reaches past the box that shows it: the
// viewport, or an ancestor that clips what overflows it.
type overrun struct {
	Element string  `json:"el"`
	Box     string  `json:"box"`
	Left    float64 `json:"left"`
	Right   float64 `json:"right"`
	Top     float64 `json:"top"`
	Bottom  float64 `json:"bottom"`
}

// plot is one drawing on the page, as rendered.
type plot struct {
	Title  string  `json:"title"`
	Width  float64 `json:"width"`
	Height float64 `json:"height"`
	Series []struct {
		Name   string  `json:"name"`
		Points int     `json:"points"`
		Width  float64 `json:"width"`
	} `json:"series"`
	Boxes  int      `json:"boxes"` // timeline actions
	Bars   int      `json:"bars"`  // memory bar segments
	XLabel string   `json:"xLabel"`
	YLabel string   `json:"yLabel"`
	XTicks []string `json:"xTicks"`
}

// layoutJS measures the page. An element must lie inside the viewport
// horizontally (the page scrolls down, never sideways), or, inside an
// ancestor whose overflow is not visible, inside that ancestor when it
// clips (hidden, clip: an SVG's edge) — an ancestor that scrolls (auto,
// scroll) shows all of it and is itself checked against the viewport.
// Boxes of zero size (SVG titles, empty cells) show nothing and are left
// out; so are elements in head.
const layoutJS = `JSON.stringify((() => {
  const de = document.documentElement;
  const vw = window.innerWidth;
  const scroller = document.scrollingElement || de;
  const name = (e) => {
    let s = e.tagName.toLowerCase();
    if (e.id) s += '#' + e.id;
    const c = e.getAttribute('class');
    if (c) s += '.' + c.trim().split(/\s+/).join('.');
    return s;
  };
  const path = (e) => {
    const p = [];
    for (let a = e; a && a !== de && p.length < 4; a = a.parentElement) p.unshift(name(a));
    let text = (e.textContent || '').trim().slice(0, 40);
    return p.join(' > ') + (text ? ' "' + text + '"' : '');
  };
  const clipper = (e) => {
    for (let a = e.parentElement; a && a !== de && a !== document.body; a = a.parentElement) {
      if (getComputedStyle(a).overflowX !== 'visible') return a;
    }
    return null;
  };
  const out = {scrollWidth: Math.max(scroller.scrollWidth, de.getBoundingClientRect().width), viewport: vw, overflows: [], plots: [],
    text: (document.body || de).textContent};
  for (const e of document.querySelectorAll('*')) {
    if (e === de || e === document.body || e.closest('head')) continue;
    const r = e.getBoundingClientRect();
    if (r.width === 0 || r.height === 0) continue;
    const c = clipper(e);
    const bad = (box, l, rt, t, b) => out.overflows.push({el: path(e), box: box, left: l, right: rt, top: t, bottom: b});
    if (c === null) {
      if (r.left < -1 || r.right > vw + 1) bad('viewport', r.left, r.right, 0, 0);
      continue;
    }
    const ox = getComputedStyle(c).overflowX;
    if (ox === 'auto' || ox === 'scroll') continue;
    const cr = c.getBoundingClientRect();
    if (r.left < cr.left - 1 || r.right > cr.right + 1 || r.top < cr.top - 1 || r.bottom > cr.bottom + 1) {
      bad(path(c), r.left - cr.left, r.right - cr.right, r.top - cr.top, r.bottom - cr.bottom);
    }
  }
  out.scrolled = Array.from(document.querySelectorAll('.scroll')).filter(e => e.scrollWidth > e.clientWidth + 1).map(path);
  for (const svg of document.querySelectorAll('svg')) {
    if (svg.parentElement && svg.parentElement.closest('svg')) continue;
    const r = svg.getBoundingClientRect();
    const t = svg.querySelector('title');
    const label = (axis) => { const l = svg.querySelector('.axis-label[data-axis="' + axis + '"]'); return l ? l.textContent : ''; };
    out.plots.push({
      title: t ? t.textContent : '',
      width: r.width, height: r.height,
      series: Array.from(svg.querySelectorAll('polyline[data-series]')).map(p => ({
        name: p.getAttribute('data-series'), points: p.points.numberOfItems, width: p.getBoundingClientRect().width})),
      boxes: svg.querySelectorAll('rect[data-kind]').length,
      bars: svg.querySelectorAll('g[data-rank] rect').length,
      xLabel: label('x'), yLabel: label('y'),
      xTicks: Array.from(svg.querySelectorAll('.tick[data-axis="x"]')).map(e => e.textContent),
    });
  }
  return out;
})())`

// checkLayout asserts that nothing is wider than the viewport or cut by a
// box that clips it, and that every drawing is non-empty with labelled
// axes and ticks. It returns the measurements for the page's own checks.
func checkLayout(t *testing.T, b *browser, page string) layout {
	t.Helper()
	var l layout
	b.eval(t, layoutJS, &l)
	assert.LessOrEqual(t, l.ScrollWidth, l.Viewport+1, "%s: the page is wider than its %.0f px viewport", page, l.Viewport)
	for i, o := range l.Overflows {
		if i == 10 {
			t.Errorf("%s: … %d more", page, len(l.Overflows)-10)
			break
		}
		t.Errorf("%s: %s reaches past %s (left %.0f, right %.0f, top %.0f, bottom %.0f px from its edges)", page, o.Element, o.Box, o.Left, o.Right, o.Top, o.Bottom)
	}
	for _, p := range l.Plots {
		assert.Greater(t, p.Width, 100.0, "%s: %q drawn %.0f px wide", page, p.Title, p.Width)
		assert.Greater(t, p.Height, 60.0, "%s: %q drawn %.0f px tall", page, p.Title, p.Height)
		assert.NotEmpty(t, p.Title, "%s: a drawing without a title", page)
		assert.NotEmpty(t, p.XLabel, "%s: %q has no x axis label", page, p.Title)
		assert.NotEmpty(t, p.YLabel, "%s: %q has no y axis label", page, p.Title)
		assert.GreaterOrEqual(t, len(p.XTicks), 2, "%s: %q has no x axis ticks", page, p.Title)
		assert.True(t, len(p.Series) > 0 || p.Boxes > 0 || p.Bars > 0, "%s: %q draws nothing", page, p.Title)
		for _, s := range p.Series {
			assert.Greater(t, s.Points, 0, "%s: %q: series %q has no points", page, p.Title, s.Name)
			if s.Points > 1 {
				assert.Greater(t, s.Width, 10.0, "%s: %q: series %q is not drawn", page, p.Title, s.Name)
			}
		}
	}
	return l
}

// plotTitled is the drawing whose title starts with prefix.
func plotTitled(t *testing.T, l layout, prefix string) plot {
	t.Helper()
	var titles []string
	for _, p := range l.Plots {
		if strings.HasPrefix(p.Title, prefix) {
			return p
		}
		titles = append(titles, p.Title)
	}
	t.Fatalf("no drawing titled %q among %q", prefix, titles)
	return plot{}
}

func seriesNames(p plot) []string {
	var names []string
	for _, s := range p.Series {
		names = append(names, s.Name)
	}
	return names
}

// shotDir is where screenshots go: GCOMPILE_SCREENSHOT_DIR when set (to
// look at them, or keep them as CI artifacts), else the test's temporary
// folder.
func shotDir(t *testing.T) string {
	if d := os.Getenv("GCOMPILE_SCREENSHOT_DIR"); d != "" {
		require.NoError(t, os.MkdirAll(d, 0o755))
		return d
	}
	return t.TempDir()
}

// The widths a page must fit: a small laptop window and a wide one.
var viewportWidths = []int{800, 1400}

// Every page gcompile writes, rendered by Chromium at each viewport
// width: nothing wider than the viewport, no text cut by a box, every
// drawing drawn with its axes labelled, and each page's own content (a
// MoE run's outputs, a compiled plan without training, the dump's merged
// columns and wrapped lines, the timeline's legend and time axis).
func TestPagesRenderInABrowser(t *testing.T) {
	chromium := needChromium(t)
	start := time.Now()
	dir := t.TempDir()
	shots := shotDir(t)

	// The browser starts while the pages are written.
	var b *browser
	var startErr error
	started := make(chan struct{})
	go func() {
		defer close(started)
		b, startErr = startBrowser(t, chromium)
	}()

	const steps = 3
	run := filepath.Join(dir, "run.html")
	dump := filepath.Join(dir, "dump")
	require.NoError(t, mainErr(append(append([]string{}, tinyGPT...), "--run", "--steps", fmt.Sprint(steps), "--eval-every", "2", "--eval-batches", "1",
		"--report", run, "--dump", dump)))
	pipe, timeline := filepath.Join(dir, "pipe.html"), filepath.Join(dir, "timeline.svg")
	require.NoError(t, mainErr([]string{gptModel, "--set", "layers=2,hidden=32,heads=2,seq=16", "--batch", "4", "--max-data-mb", "1",
		"--devices", "2", "--pp", "2", "--microbatches", "4", "--run", "--steps", "2", "--eval-batches", "1",
		"--report", pipe, "--timeline", timeline}))
	moe := filepath.Join(dir, "moe.html")
	require.NoError(t, mainErr([]string{moeModel, "--set", "layers=2,hidden=32,heads=2,seq=16,experts=4", "--batch", "4", "--max-data-mb", "1",
		"--run", "--steps", fmt.Sprint(steps), "--eval-batches", "1", "--report", moe}))
	plan := filepath.Join(dir, "plan.html")
	require.NoError(t, mainErr([]string{gptModel, "--set", "layers=2,hidden=32,heads=2,seq=16", "--batch", "8",
		"--devices", "4", "--pp", "2", "--dp", "2", "--microbatches", "4", "--report", plan}))
	written := time.Since(start)
	<-started
	require.NoError(t, startErr, "starting %s", chromium)

	visit := func(name, path string, check func(w int, l layout)) {
		for _, w := range viewportWidths {
			b.load(t, "file://"+path, w, 1000)
			l := checkLayout(t, b, fmt.Sprintf("%s at %d px", name, w))
			if w >= 1400 {
				// A wide window shows every table whole: the memory
				// table's dozen columns once hid behind a scrollbar there.
				assert.Empty(t, l.Scrolled, "%s at %d px: tables that must be scrolled to be read", name, w)
			}
			b.screenshot(t, filepath.Join(shots, fmt.Sprintf("%s-%d.png", name, w)), w)
			check(w, l)
		}
	}

	visit("run", run, func(_ int, l layout) {
		require.Len(t, l.Plots, 4, "loss, speed, gradient norm, memory")
		loss := plotTitled(t, l, "loss per step")
		assert.Equal(t, []string{"train loss", "held-out loss"}, seriesNames(loss))
		assert.Equal(t, steps, loss.Series[0].Points)
		assert.Equal(t, "step", loss.XLabel)
		assert.Equal(t, "0 KiB", plotTitled(t, l, "peak memory").XTicks[0], "ticks in the unit of the peaks, a few hundred KiB")
		assert.NotContains(t, l.Text, "Pipeline schedule")
	})
	visit("pipe", pipe, func(_ int, l layout) {
		tl := plotTitled(t, l, "pipeline schedule")
		assert.Equal(t, 2*2*4, tl.Boxes, "forward and backward of 4 microbatches on 2 ranks")
		assert.Contains(t, tl.XLabel, "simulated time")
		assert.Equal(t, 2, plotTitled(t, l, "peak memory").Bars/4, "two ranks of params, gradients, optimizer state, activations at least")
	})
	visit("moe", moe, func(_ int, l layout) {
		for _, title := range []string{"MoE load-balancing loss", "MoE router z-loss", "routing choices dropped", "expert load: h.1.moe"} {
			p := plotTitled(t, l, title)
			require.NotEmpty(t, p.Series, title)
			assert.Equal(t, steps, p.Series[0].Points, title)
		}
		assert.Equal(t, []string{"expert 0", "expert 1", "expert 2", "expert 3"}, seriesNames(plotTitled(t, l, "expert load: h.1.moe")))
		assert.Equal(t, []string{"h.1.moe"}, seriesNames(plotTitled(t, l, "MoE load-balancing loss")))
	})
	visit("plan", plan, func(_ int, l layout) {
		require.Len(t, l.Plots, 2, "memory and the schedule; nothing of training")
		assert.NotContains(t, l.Text, "Training")
		assert.NotContains(t, l.Text, "measured")
		for _, setting := range []string{"warmup", "min_lr", "seed", "processes"} {
			assert.NotContains(t, l.Text, setting, "a compile does not use %s", setting)
		}
		assert.Contains(t, l.Text, "compiled only")
		assert.Equal(t, 2*2*4, plotTitled(t, l, "pipeline schedule").Boxes)
	})
	visit("timeline", timeline, func(_ int, l layout) {
		require.Len(t, l.Plots, 1)
		tl := l.Plots[0]
		assert.Equal(t, 2*2*4, tl.Boxes)
		assert.Contains(t, l.Text, "forward (F)")
		assert.Contains(t, l.Text, "backward (B)")
		assert.Contains(t, l.Text, "idle")
		assert.Equal(t, "simulated time (cost units: F = 1, B = 2)", tl.XLabel)
		assert.Equal(t, "pipeline rank", tl.YLabel)
		assert.GreaterOrEqual(t, tl.Width, 600.0, "big enough to read the boxes' labels")
	})
	visit("dump", filepath.Join(dump, "index.html"), func(w int, _ layout) {
		var d struct {
			Columns  []string `json:"columns"`
			Wide     []string `json:"wide"`
			Wrapped  int      `json:"wrapped"`
			Longest  int      `json:"longest"`
			LineChar float64  `json:"lineChar"`
		}
		b.eval(t, `JSON.stringify((() => {
  const out = {columns: [], wide: [], wrapped: 0, longest: 0};
  for (const c of document.querySelectorAll('section.col')) out.columns.push(c.querySelector('.hd .ps').textContent);
  for (const body of document.querySelectorAll('.body')) {
    if (body.scrollWidth > body.clientWidth + 1) out.wide.push(body.parentElement.id + ': ' + body.scrollWidth + ' > ' + body.clientWidth);
  }
  for (const l of document.querySelectorAll('.body .l')) {
    out.longest = Math.max(out.longest, l.textContent.length);
    if (l.getBoundingClientRect().height > 20) out.wrapped++;
  }
  return out;
})())`, &d)
		assert.Empty(t, d.Wide, "a column whose lines run past its edge")
		assert.Greater(t, d.Longest, 64, "the model has lines longer than a column")
		assert.Positive(t, d.Wrapped, "long lines wrap")
		require.NotEmpty(t, d.Columns)
		assert.Contains(t, d.Columns[0], "input + ", "the input column lists the unchanged passes after it")
		for _, c := range d.Columns[1:] {
			assert.NotContains(t, c, "unchanged", "no column of its own for unchanged passes")
		}
		var names []string
		for _, c := range d.Columns {
			names = append(names, strings.Fields(c)...)
		}
		for _, p := range []string{"autodiff", "optimizer", "verify-input", "fuse"} {
			assert.True(t, strings.Contains(strings.Join(names, " "), p), "pass %s is named in a header: %q", p, d.Columns)
		}
	})
	t.Logf("pages written in %v, rendered and checked by %v in all; screenshots in %s", written.Round(time.Millisecond), time.Since(start).Round(time.Millisecond), shots)
}

// skipper is the part of testing.TB needChromium uses, so a test can
// see what it does without a browser.
type skipper interface {
	Helper()
	Fatalf(format string, args ...any)
	Skip(args ...any)
}

// recordTB records what needChromium asked of its test.
type recordTB struct{ fatal, skip string }

func (r *recordTB) Helper()                           {}
func (r *recordTB) Fatalf(format string, args ...any) { r.fatal = fmt.Sprintf(format, args...) }
func (r *recordTB) Skip(args ...any)                  { r.skip = fmt.Sprint(args...) }

// With GCOMPILE_REQUIRE_CHROMIUM=1 a missing browser fails rather than
// skips, so CI cannot pass the browser checks by not running them.
func TestNeedChromiumFailsWhenRequired(t *testing.T) {
	t.Setenv("GCOMPILE_CHROMIUM", filepath.Join(t.TempDir(), "no-such-browser"))
	var r recordTB
	t.Setenv("GCOMPILE_REQUIRE_CHROMIUM", "")
	assert.Empty(t, needChromium(&r))
	assert.Empty(t, r.fatal)
	assert.Contains(t, r.skip, "no-such-browser")
	assert.Contains(t, r.skip, "GCOMPILE_REQUIRE_CHROMIUM=1")

	r = recordTB{}
	t.Setenv("GCOMPILE_REQUIRE_CHROMIUM", "1")
	assert.Empty(t, needChromium(&r))
	assert.Empty(t, r.skip)
	assert.Contains(t, r.fatal, "GCOMPILE_REQUIRE_CHROMIUM=1 but GCOMPILE_CHROMIUM=")
}
