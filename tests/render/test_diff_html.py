"""``ckpt diff --values --html/--csv``: one self-contained page, checked in a real headless browser.

The browser is Debian's ``chromium`` (.ci/run installs it when absent); where none can be found the
browser tests skip and say so. The page must render (a screenshot whose pixels vary), show its table
rows and heatmap in the DOM chromium builds, log no console error, parse, and name no http(s) URL.
"""
from __future__ import annotations

import csv
import html.parser
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "commands" / "diff"))
from diff_training import train

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="no chromium found on PATH (Debian: apt-get install "
                                                             "chromium; .ci/run installs it): browser checks skipped")
BROWSER_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """An HTML report and its CSV for step 3 against step 6 of a real training run (with an inf in B)."""
    folder = tmp_path_factory.mktemp("html")
    steps = train(folder)
    b = torch.load(steps[6])
    b["head.bias"][0] = float("inf")
    torch.save(b, steps[6])
    page, table = folder / "report.html", folder / "values.csv"
    r = subprocess.run([sys.executable, "-m", "ckpt_tool", "diff", "--values", "--sort", "rel_l2", "--rollup-layers",
                        "--html", str(page), "--csv", str(table), str(steps[3]), str(steps[6])],
                       check=False, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stderr  # differences: exit 1, and both files written all the same
    return page, table, steps


class _Collect(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.open: list[str] = []
        self.urls: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag not in ("meta", "br", "link", "img", "input", "rect", "line"):
            self.open.append(tag)
        self.urls += [v for k, v in attrs if k in ("src", "href") and v]

    def handle_startendtag(self, tag, attrs):
        self.tags.append(tag)

    def handle_endtag(self, tag):
        if tag in ("rect", "line"):
            return
        assert self.open and self.open[-1] == tag, (tag, self.open[-5:])
        self.open.pop()


def test_page_parses_is_self_contained_and_holds_every_part(report):
    page, _, steps = report
    text = page.read_text(encoding="utf-8")
    p = _Collect()
    p.feed(text)
    p.close()
    assert p.open == []  # every element closed, in order
    assert not re.search(r"https?://", text) and p.urls == []  # nothing to fetch, no link out
    assert "<script src" not in text and "@import" not in text and "url(" not in text
    assert p.tags.count("svg") >= 1 + 3  # the heatmap and three histograms at least
    assert "class=\"heatmap\"" in text and "prefers-color-scheme: dark" in text
    rows = re.findall(r"<tr><td>([^<]+)</td>", text.split("id='values'")[1].split("</table>")[0])
    assert len(rows) == len(torch.load(steps[3]))
    assert "result: differences:" in text


def test_csv_holds_the_table_in_sort_order(report):
    _, table, steps = report
    with open(table, newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(torch.load(steps[3]))
    rel = [float(r["rel_l2"]) for r in rows]
    assert rel == sorted(rel, reverse=True) and rows[0]["key"] == "head.bias" and rows[0]["max_rel"] == "inf"
    assert not [n for n in os.listdir(table.parent) if n.startswith(".") or n.endswith(".tmp")]  # no temporaries


def test_an_unwritable_html_path_is_one_line_and_exit_2(report, tmp_path, run_cli):
    _, _, steps = report
    r = run_cli("diff", "--values", "--html", str(tmp_path / "no" / "such" / "r.html"), str(steps[3]), str(steps[6]))
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1


def test_a_report_never_replaces_an_input(report, run_cli):
    _, _, steps = report
    before = steps[3].read_bytes()
    for option in ("--html", "--csv"):
        r = run_cli("diff", "--values", option, str(steps[3]), str(steps[3]), str(steps[6]))
        assert r.code == 2 and "never modifies its input" in r.err
    assert steps[3].read_bytes() == before


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [CHROMIUM, *BROWSER_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", *args]
    r = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=120)
    if "--dump-dom" in args and "</html>" not in r.stdout:  # once more: see the screenshot test
        r = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=120)
    return r


@needs_chromium
def test_chromium_renders_the_page_without_console_errors(report, tmp_path):
    page, _, _ = report
    shot = tmp_path / "shot.png"
    for _ in range(2):  # a first start in a fresh profile has been seen to exit before writing the screenshot
        r = _chromium(tmp_path, "--enable-logging=stderr", "--v=0", f"--screenshot={shot}",
                      "--window-size=1200,1400", page.as_uri())
        if shot.exists():
            break
    assert shot.exists() and shot.stat().st_size > 10_000, r.stderr[-2000:]
    assert "Uncaught" not in r.stderr and "ERROR:CONSOLE" not in r.stderr, r.stderr[-2000:]
    assert _distinct_colours(shot) > 20  # not a blank page: the heatmap ramp alone has dozens


@needs_chromium
def test_chromium_dom_shows_the_rows_and_the_heatmap(report, tmp_path):
    page, _, steps = report
    r = _chromium(tmp_path, "--dump-dom", page.as_uri())
    dom = r.stdout
    assert "<svg class=\"heatmap\"" in dom and dom.count("class=\"cell\"") == 4 * 8  # 4 layers x 8 roles
    assert dom.count("<tr><td>") >= len(torch.load(steps[3]))
    assert dom.count('data-sortable="ready"') == 2  # the script ran to its end on both tables


@needs_chromium
def test_chromium_sorts_the_table_by_the_column_in_the_address(report, tmp_path):
    page, table, _ = report
    r = _chromium(tmp_path, "--dump-dom", page.as_uri() + "#sort=cosine-asc")
    values = r.stdout.split('id="values"')[1].split("</table>")[0]
    shown = re.findall(r"<tr><td>([^<]+)</td>", values)
    with open(table, newline="") as f:
        rows = list(csv.DictReader(f))
    want = [row["key"] for row in sorted(rows, key=lambda row: float(row["cosine"]))]
    assert shown == want and 'class="sorted-asc"' in values


def _distinct_colours(png: Path) -> int:
    """Distinct RGB triples in a PNG (read with the standard library: zlib, no imaging dependency)."""
    import struct
    import zlib

    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, height, ctype = 8, b"", 0, 0, 0
    while pos < len(data):
        (length,), kind = struct.unpack(">I", data[pos:pos + 4]), data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, ctype = struct.unpack(">IIBB", body[:10])
            assert depth == 8
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    channels = {2: 3, 6: 4}[ctype]
    raw = zlib.decompress(idat)
    stride = width * channels
    prev = bytearray(stride)
    seen: set[bytes] = set()
    for y in range(height):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b, c = prev[i], prev[i - channels] if i >= channels else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        if y % 4 == 0:
            seen.update(bytes(line[x:x + 3]) for x in range(0, stride, channels * 4))
        prev = line
    return len(seen)


def test_writing_into_a_missing_folder_is_a_write_error_and_leaves_nothing(report, tmp_path):
    from ckpt_tool import diff
    from ckpt_tool.errors import WriteError
    from ckpt_tool.render.html import write_html

    _, _, steps = report
    r = diff(str(steps[3]), str(steps[6]), values=True)
    with pytest.raises(WriteError):
        write_html(r, str(tmp_path / "gone" / "r.html"))
    write_html(r, str(tmp_path / "r.html"))
    umask = os.umask(0)
    os.umask(umask)
    assert os.listdir(tmp_path) == ["r.html"] and (tmp_path / "r.html").stat().st_mode & 0o777 == 0o666 & ~umask


def test_heatmap_keeps_two_stacks_apart_and_a_model_without_layers_says_so(tmp_path):
    from ckpt_tool import diff
    from ckpt_tool.render.html import html_text

    torch.manual_seed(0)
    a = {f"{stack}.layers.{i}.w": torch.randn(4) for stack in ("encoder", "decoder") for i in range(3)}
    a["head.w"] = torch.randn(4)
    b = {k: v + 0.1 for k, v in a.items()}
    torch.save(a, tmp_path / "a.pth")
    torch.save(b, tmp_path / "b.pth")
    text = html_text(diff(str(tmp_path / "a.pth"), str(tmp_path / "b.pth"), values=True))
    heat = text.split('class="heatmap"')[1].split("</svg>")[0]
    assert heat.count('class="cell"') == 6 and ">encoder.layers.*.w<" in heat and ">decoder.layers.*.w<" in heat
    torch.save({"w": torch.ones(3)}, tmp_path / "c.pth")
    torch.save({"w": torch.zeros(3)}, tmp_path / "d.pth")
    text = html_text(diff(str(tmp_path / "c.pth"), str(tmp_path / "d.pth"), values=True))
    assert 'class="heatmap"' not in text and "No key holds a layer index" in text


def test_the_page_states_the_verdict_and_the_fix_command(report, tmp_path):
    from html import unescape

    from ckpt_tool import diff
    from ckpt_tool.render.html import html_text

    _, _, steps = report
    ddp = tmp_path / "ddp.pth"
    torch.save({"module." + k: v for k, v in torch.load(steps[3]).items()}, ddp)
    r = diff(str(ddp), str(steps[3]), values=True)
    text = html_text(r)
    fix = unescape(text.split("<pre id='fix'>")[1].split("</pre>")[0])
    assert fix == r.migrate_command() and "--strip-prefix module." in fix
    assert "result: differences:" in text and "Missing keys (in B, not in A): " in text
