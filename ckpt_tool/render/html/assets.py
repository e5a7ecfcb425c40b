"""The report's inline style and script: nothing is fetched, so the file reads the same offline and in CI.

The style follows the reader's light or dark preference (prefers-color-scheme)
through CSS variables that the SVG (svg.py) also uses. The script only sorts
the tables when a header is clicked (numbers by their exact value in
``data-v``, text alphabetically), or on opening when the address ends in
``#sort=COLUMN`` (``-asc`` for smallest first).
"""
from __future__ import annotations

CSS = """
:root { color-scheme: light dark; --bg: #ffffff; --fg: #1d2330; --muted: #5b6475; --line: #d5d9e0;
  --head: #eef1f5; --ok: #1a7f37; --fail: #c62828; --same: #c8ccd4; --bad: #111111; --bar: #3d6fb6;
  --zero: #9aa3b2; --code: #f3f4f7; }
@media (prefers-color-scheme: dark) {
  :root { --bg: #14171c; --fg: #e3e6eb; --muted: #9aa3b2; --line: #343a45; --head: #1f242c; --ok: #4cc26b;
    --fail: #ff6b6b; --same: #3a404b; --bad: #f5f5f5; --bar: #6ea1ee; --zero: #6b7383; --code: #1f242c; }
}
* { box-sizing: border-box; }
body { margin: 0 auto; max-width: 1200px; padding: 20px 24px 48px; background: var(--bg); color: var(--fg);
  font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; }
h1 { font-size: 20px; margin: 0 0 4px; } h2 { font-size: 16px; margin: 28px 0 8px; }
.muted { color: var(--muted); }
.verdict { font-size: 16px; font-weight: 600; padding: 8px 12px; border-radius: 6px; border: 1px solid var(--line); }
.verdict.ok { color: var(--ok); } .verdict.fail { color: var(--fail); }
pre, code { font: 12.5px/1.4 ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; }
pre { background: var(--code); padding: 8px 10px; border-radius: 6px; overflow-x: auto; white-space: pre-wrap; }
table { border-collapse: collapse; width: 100%; font-size: 12.5px; }
th, td { border-bottom: 1px solid var(--line); padding: 3px 8px; text-align: right; white-space: nowrap; }
th { background: var(--head); cursor: pointer; user-select: none; position: sticky; top: 0; }
th.sorted-asc::after { content: " \\25B2"; } th.sorted-desc::after { content: " \\25BC"; }
td:first-child, th:first-child { text-align: left; }
td.fail { color: var(--fail); font-weight: 600; } td.ok { color: var(--ok); }
.scroll { max-height: 640px; overflow: auto; border: 1px solid var(--line); border-radius: 6px; }
svg text { fill: var(--fg); } svg .tick { font-size: 10.5px; fill: var(--muted); }
svg .bar { fill: var(--bar); } svg .bar.zero { fill: var(--zero); } svg .axis { stroke: var(--line); }
svg .cell:hover { stroke: var(--fg); stroke-width: 1.5; }
.hists { display: grid; grid-template-columns: repeat(auto-fill, minmax(800px, 1fr)); gap: 6px 12px; }
.hrow { border-top: 1px solid var(--line); padding-top: 6px; } .hrow .k { font-size: 12.5px; word-break: break-all; }
ul.warn li { color: var(--muted); }
"""

JS = r"""
(function () {
  function cellValue(td) {
    var v = td.getAttribute('data-v');
    if (v === null) { return td.textContent; }
    if (v === 'inf') { return Infinity; } if (v === '-inf') { return -Infinity; }
    if (v === 'nan') { return Infinity; }
    return parseFloat(v);
  }
  document.querySelectorAll('table.sortable').forEach(function (table) {
    var heads = table.querySelectorAll('th');
    heads.forEach(function (th, col) {
      th.addEventListener('click', function () {
        var body = table.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows);
        var desc = !th.classList.contains('sorted-desc');
        heads.forEach(function (h) { h.classList.remove('sorted-asc', 'sorted-desc'); });
        th.classList.add(desc ? 'sorted-desc' : 'sorted-asc');
        rows.sort(function (a, b) {
          var x = cellValue(a.cells[col]), y = cellValue(b.cells[col]);
          var c = (typeof x === 'number' && typeof y === 'number') ? x - y : String(x).localeCompare(String(y));
          if (c !== c) { c = 0; }
          return desc ? -c : c;
        });
        rows.forEach(function (r) { body.appendChild(r); });
      });
    });
    table.setAttribute('data-sortable', 'ready');
  });
  // #sort=COLUMN (largest first) or #sort=COLUMN-asc: a link that opens the tables sorted so
  var m = /sort=([\w ]+?)(-asc)?$/.exec(decodeURIComponent(window.location.hash));
  if (m) {
    document.querySelectorAll('table.sortable th').forEach(function (th) {
      if (th.textContent === m[1]) { th.click(); if (m[2]) { th.click(); } }
    });
  }
})();
"""
