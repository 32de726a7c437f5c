// Package dump renders the per-pass snapshots of a module as one
// self-contained HTML page, so a pass's effect can be read side by side with
// its neighbours, in the spirit of Go's GOSSAFUNC ssa.html.
//
// The pass driver, run with --dump DIR, collects one Column per pass (the
// module's gir text after the pass, whether it changed anything, how long it
// took) and calls WriteHTML to produce DIR/index.html. The page shows:
//
//   - one column per pass that changed the module, each scrolling on its own,
//     with a header giving the pass name, its time and the value counts
//     (+added, −removed, ~rewritten in place, total);
//   - passes that changed nothing merged into the column before them, as
//     GOSSAFUNC merges passes with identical output: the header lists their
//     names ("autodiff + cse + dce"), their times on hover, their notes;
//   - lines longer than the column wrapped, the rest indented;
//   - lines defining values that the pass added highlighted, lines whose
//     value kept its id but changed text marked in the margin, and the lines
//     of values it removed listed struck through at the column's bottom;
//   - lines in the backward and optimizer phases (phase=bwd, phase=opt)
//     tinted, so the three parts of a training step stand apart;
//   - every %N reference clickable: a click highlights that value in all
//     columns (several values at once, each in its own colour) and scrolls
//     the other columns to its definition; a second click or Escape clears.
//
// The page works from the text alone: value identity comes from the gir
// convention that a value keeps its id across passes, so "added" means
// defined in this column but not in the previous one shown. Nothing here
// depends on package ir, which keeps dumps usable even when a pass left the
// module unparsable.
//
// Big modules (tens of thousands of lines per column) stay responsive: lines
// are plain elements grouped into chunks that the browser skips laying out
// while they are off screen, and highlighting uses class lookups rather than
// walking the document.
package dump
