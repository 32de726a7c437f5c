package dump

// pageCSS lays the page out as a fixed-height viewport with a horizontally
// scrolling row of columns, each scrolling vertically on its own, so columns
// of very different lengths can be compared at any depth. A line longer
// than its column wraps, with the rest indented, rather than running under
// the next column: gir lines carry their attributes and source position at
// the end, which is what a reader looks for. A line's height is one
// lineHeightPx unless it wraps, so skipped chunks are sized about right.
const pageCSS = `*{box-sizing:border-box}
html,body{margin:0;height:100%}
body{display:flex;flex-direction:column;font:13px/1.35 system-ui,sans-serif;color:#222;background:#f4f4f4}
#top{flex:none;display:flex;flex-wrap:wrap;gap:.4em 1.5em;align-items:baseline;padding:6px 10px;background:#fff;border-bottom:1px solid #bbb}
#top h1{margin:0;font-size:15px}
.sum{color:#444}
.help{color:#666;font-size:12px}
#top .key{display:inline-block;min-height:0;padding:0 4px;text-indent:0}
#cols{flex:1;min-height:0;display:flex;overflow-x:auto;overflow-y:hidden}
.col{flex:none;width:64ch;min-width:14ch;display:flex;flex-direction:column;overflow:hidden;resize:horizontal;background:#fff;border-right:1px solid #aaa}
.hd{flex:none;padding:3px 6px;background:#e8ecf8;border-bottom:1px solid #bbb;overflow-wrap:anywhere}
.pn{font-weight:bold}
.same{color:#555}
.sm{color:#777}
.pnote{color:#a70;font-size:11px}
.ix{margin-right:.4em;color:#888;font-size:11px}
.st{color:#555;font-size:11px}
.na{color:#070}
.nr{color:#b00}
.nm{color:#a70}
.body{flex:1;min-height:0;overflow:auto;font:12px/16px ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
.ch{content-visibility:auto}
.l{min-height:16px;padding:0 6px 0 calc(6px + 4ch);text-indent:-4ch;white-space:pre-wrap;overflow-wrap:anywhere}
.l.pb{background:#f4f1ff}
.l.po{background:#fff6e6}
.l.a{background:#ccf2c4}
.l.m{box-shadow:inset 4px 0 #e0a000}
.l.c{color:#888}
.l.r{color:#a55;background:#fbe9e9;text-decoration:line-through}
.rm{margin-top:8px;border-top:2px solid #e99}
.rh{padding:2px 6px;color:#b00;font:bold 11px system-ui,sans-serif}
.empty{padding:1em}
.v{cursor:pointer;border-radius:2px}
.v:hover{text-decoration:underline}
.h0{background:#7fffd4;outline:1px solid #2a8}
.h1{background:#ffb08a;outline:1px solid #d60}
.h2{background:#ffc0cb;outline:1px solid #d48}
.h3{background:#b0c4de;outline:1px solid #58a}
.h4{background:#ffff60;outline:1px solid #aa0}
.h5{background:#87ceeb;outline:1px solid #28b}
.h6{background:#d8b0ff;outline:1px solid #84c}
.h7{background:#c8c8c8;outline:1px solid #777}
.d.h0,.d.h1,.d.h2,.d.h3,.d.h4,.d.h5,.d.h6,.d.h7{font-weight:bold;outline-width:2px}
`

// pageJS implements click-to-highlight. Each selected value takes one of
// eight colour classes (the oldest selection gives its colour up when all
// are taken); elements are found by their "v<id>" class, which the browser
// indexes, so selecting stays fast on big pages. On selection the other
// columns scroll to the value's definition if it is out of view there.
const pageJS = `(function () {
  'use strict';
  var N = 8, slot = [], order = [];
  for (var k = 0; k < N; k++) slot.push(null);
  function each(id, f) {
    var es = document.getElementsByClassName('v' + id);
    for (var i = 0; i < es.length; i++) f(es[i]);
  }
  function clear(k) {
    var id = slot[k];
    if (id === null) return;
    each(id, function (e) { e.classList.remove('h' + k); });
    slot[k] = null;
    order = order.filter(function (x) { return x !== k; });
  }
  function idOf(e) {
    var cs = e.classList;
    for (var i = 0; i < cs.length; i++) {
      if (/^v\d+$/.test(cs[i])) return cs[i].slice(1);
    }
    return null;
  }
  function reveal(id, from) {
    var bodies = document.querySelectorAll('.body');
    for (var i = 0; i < bodies.length; i++) {
      var b = bodies[i];
      if (b === from) continue;
      var d = b.querySelector('.d.v' + id);
      if (!d) continue;
      var r = d.getBoundingClientRect(), br = b.getBoundingClientRect();
      if (r.top < br.top || r.bottom > br.bottom) {
        b.scrollTop += r.top - br.top - b.clientHeight / 2;
      }
    }
  }
  document.getElementById('cols').addEventListener('click', function (ev) {
    var t = ev.target;
    if (!t.classList || !t.classList.contains('v')) return;
    var id = idOf(t);
    if (id === null) return;
    var k = slot.indexOf(id);
    if (k >= 0) { clear(k); return; }
    k = slot.indexOf(null);
    if (k < 0) { k = order[0]; clear(k); }
    slot[k] = id;
    order.push(k);
    each(id, function (e) { e.classList.add('h' + k); });
    reveal(id, t.closest('.body'));
  });
  document.addEventListener('keydown', function (ev) {
    if (ev.key === 'Escape') for (var k = 0; k < N; k++) clear(k);
  });
})();
`
