"""The HTML site (sdq.lab.site): built from the docs pages and the executed notebooks, and
browsed in a real headless Chromium: every page loads, every image shows, no link is broken.

The site is built at smoke size from a small repository made here: a docs template with a
table, a real altair chart and links to the notebook and the evidence; an executed notebook
with an image output and a kept run; a notebook never run. Building it never touches docs/.
The committed outputs/*/default/ are not browsed here: their templates may run ahead of them
until the notebooks are rerun, which `make docs` reports.
"""

from __future__ import annotations

import base64
import shutil
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import altair as alt
import nbformat
import pandas as pd
import pytest
from browser_support import Browser, BrowserError, Loaded, find_browser, serve
from lab_support import make_repo

from sdq.errors import LabError
from sdq.lab import Outputs, site
from sdq.lab.verdict import Claim, judge

PARAMS = "smoke"
TEMPLATE = """# Demo

What the demo measures; [the notebook](../notebooks/00_demo.ipynb).

{{table:T2}}

{{chart:bytes}}

One expert is {{value:expert_bytes}} bytes.
"""


# --- link rewriting ------------------------------------------------------------------------


PLACES = {
    "notebooks/00_demo.ipynb": "notebooks/00_demo.ipynb",
    "notebooks/01_other.ipynb": "notebooks/source/01_other.ipynb",
    "outputs/00_demo/smoke/": "outputs/00_demo/smoke/index.md",
    "outputs/00_demo/smoke/verdicts.json": "outputs/00_demo/smoke/verdicts.json",
}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[Demo](../notebooks/00_demo.ipynb)", "[Demo](notebooks/00_demo.ipynb)"),
        ("[Other](../notebooks/01_other.ipynb)", "[Other](notebooks/source/01_other.ipynb)"),
        ("*[x](../outputs/00_demo/smoke/).*", "*[x](outputs/00_demo/smoke/index.md).*"),
        ("[ok](../outputs/00_demo/smoke/verdicts.json#c1)",
         "[ok](outputs/00_demo/smoke/verdicts.json#c1)"),
        ("![Bytes](charts/00_demo/bytes.svg)", "![Bytes](charts/00_demo/bytes.svg)"),
        ("[T2](#table-catalogue) [p](00_demo.md) [w](https://example.org/a)", None),
        ("| [a](../notebooks/00_demo.ipynb) | [b](../outputs/00_demo/smoke/) |",
         "| [a](notebooks/00_demo.ipynb) | [b](outputs/00_demo/smoke/index.md) |"),
    ],
)  # fmt: skip
def test_links_out_of_docs_are_rewritten_to_their_place_in_the_site(text, expected):
    assert site.rewrite_links(text, "index.md", PLACES.get) == (expected or text)


@pytest.mark.parametrize(
    ("link", "message"),
    [
        ("../outputs/05_peers/smoke/",
         "00_demo.md: link ../outputs/05_peers/smoke/: the site holds no outputs/05_peers/smoke/"),
        ("../README.md", "00_demo.md: link ../README.md: the site holds no README.md"),
        ("../../etc/passwd", "00_demo.md: link ../../etc/passwd: points outside the repository"),
    ],
)  # fmt: skip
def test_a_link_the_site_cannot_hold_names_page_and_link(link, message):
    with pytest.raises(LabError) as err:
        site.rewrite_links(f"text [x]({link}) more", "00_demo.md", PLACES.get)
    assert str(err.value) == message


def test_resolver_prefers_the_executed_notebook_and_lands_folders_on_their_index(tmp_path):
    for rel in (
        "notebooks/00_demo.ipynb",
        "notebooks/source/01_other.ipynb",
        "outputs/00_demo/smoke/index.md",
        "outputs/00_demo/smoke/tables/T2.md",
    ):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x")
    resolve = site.site_resolver(tmp_path)
    assert resolve("notebooks/00_demo.ipynb") == "notebooks/00_demo.ipynb"
    assert resolve("notebooks/01_other.ipynb") == "notebooks/source/01_other.ipynb"
    assert resolve("notebooks/02_missing.ipynb") is None
    assert resolve("outputs/00_demo/smoke/") == "outputs/00_demo/smoke/index.md"
    assert resolve("outputs/00_demo/smoke/tables/T2.md") == "outputs/00_demo/smoke/tables/T2.md"
    assert resolve("outputs/00_demo/smoke/tables/T9.md") is None
    assert resolve("params/smoke.yaml") is None


def test_the_default_site_holds_a_notebook_s_own_set_where_its_page_links(tmp_path):
    """06 runs only with seed-scale: the default site copies outputs/06_…/seed-scale/ to that
    place, the one its page links to (it was copied under default/, a dead link)."""
    from sdq.lab.paths import OWN_PARAMS

    stem, own = next(iter(OWN_PARAMS.items()))
    out = tmp_path / "outputs" / stem / own
    (out / "tables").mkdir(parents=True)
    (out / "tables" / "T4.md").write_text("x")
    source = tmp_path / "src"
    site.copy_evidence(site.Layout(tmp_path, "default"), stem, source)
    resolve = site.site_resolver(source)
    assert resolve(f"outputs/{stem}/{own}/") == f"outputs/{stem}/{own}/index.md"
    assert resolve(f"outputs/{stem}/{own}/tables/T4.md") == f"outputs/{stem}/{own}/tables/T4.md"
    assert not (source / "outputs" / stem / "default").exists()


# --- a smoke-size repository ---------------------------------------------------------------


def make_lab(root: Path) -> Path:
    """Two notebooks and their templates; 00_demo ran (table, chart, value, executed notebook
    with an image output, provenance, one kept run), 01_other never did."""
    make_repo(root, {}, {"00_demo": ("",), "01_other": ("",)})
    src = root / "docs" / "src"
    src.mkdir(parents=True)
    (src / "00_demo.md").write_text(TEMPLATE)
    (src / "01_other.md").write_text("# Other\n\n{{table:T1}}\n")
    out = Outputs("00_demo", PARAMS, root=root / "outputs")
    df = pd.DataFrame({"part": ["gate", "up", "down"], "bytes": [589824, 720896, 589824]})
    out.table("T2", df, title="One expert", note="L0E0")
    chart = alt.Chart(df, title="Bytes per segment").mark_bar().encode(x="part", y="bytes")
    out.chart("bytes", chart, alt="Bars: bytes of the gate, up and down segments")
    out.value("expert_bytes", 1900544)
    claim = Claim(  # one recorded verdict: the index gets its widest tables
        "000-§0-parallel-prefetch-on-emulated-seed-ssd",
        "T4",
        "+48.0 % decode tok/s (3.73 -> 5.52) with segment-parallel reads and prefetch on",
        seed=1.48,
        direction="higher",
        metric="decode_tok_s",
        a="serial x8 prefetch on, emulated seed SSD",
        b="parallel x16 prefetch on, emulated seed SSD",
        basis="prediction",
    )
    pairs = [(4.0, 4.0 * r) for r in (1.30, 1.41, 1.52, 1.38, 1.47, 1.35)]
    why = "a device model fitted to the seed's §1 table, 8 of 256 experts per layer, 4 layers, "
    out.verdict(claim, judge(claim, pairs, why=why + "2 compute threads; the seed's 40 layers"))
    (out.dir / "provenance.json").write_text('{"date_utc": "2026-01-02T03:04:05Z"}\n')
    run = out.dir / "runs" / "20260102T030405Z"  # one kept run: the page links runs/
    shutil.copytree(out.dir / "tables", run / "tables")
    shutil.copyfile(out.dir / "provenance.json", run / "provenance.json")
    png = (out.dir / "charts" / "bytes.png").read_bytes()
    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_markdown_cell("# Demo\n\nWhat this measures."))
    cell = nbformat.v4.new_code_cell("out.chart('bytes', chart)", execution_count=1)
    cell.outputs.append(
        nbformat.v4.new_output(
            "display_data", data={"image/png": base64.b64encode(png).decode("ascii")}
        )
    )
    nb.cells.append(cell)
    nbformat.write(nb, out.dir / "00_demo.ipynb")
    return root


@pytest.fixture(scope="module")
def browser():
    try:
        find_browser()
    except BrowserError as exc:
        pytest.fail(str(exc), pytrace=False)
    with Browser.launch() as b:
        yield b


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    return make_lab(tmp_path_factory.mktemp("lab"))


@pytest.fixture(scope="module")
def smoke_site(lab):
    """The smoke site, built by the command line as `make docs PARAMS=smoke` runs it."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(site, "repo_root", lambda: lab)
        assert site.main(["--params", PARAMS]) == 0
    return lab / "site" / PARAMS


def browse(folder: Path, browser: Browser) -> dict[str, Loaded]:
    """Load every page of the site in the browser; check pages, images and links; return the
    pages by path. Every problem is collected, then all are reported at once."""
    pages = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.html"))
    assert "index.html" in pages
    problems: list[str] = []
    with serve(folder) as base:
        loaded = {rel: browser.load(base + rel) for rel in pages}
        status: dict[str, int] = {}
        for rel, page in loaded.items():
            problems += _page_problems(rel, page)
            for href in page.links:
                if not href.startswith(base):
                    continue  # the theme's credit line, if any: not part of this site
                target, _, anchor = href[len(base) :].partition("#")
                if target not in status:
                    status[target] = _http_status(base + target)
                if status[target] != 200:
                    problems.append(f"{rel}: link {href} answers {status[target]}")
                landing = loaded.get(urllib.parse.unquote(target) or "index.html")
                if anchor and landing and urllib.parse.unquote(anchor) not in landing.ids:
                    problems.append(f"{rel}: link {href}: no #{anchor} on that page")
    assert not problems, f"{len(problems)} problems, first: " + "\n".join(problems[:10])
    return loaded


def _page_problems(rel: str, page: Loaded) -> list[str]:
    found = []
    if page.status != 200:
        found.append(f"{rel}: HTTP {page.status}")
    if not page.title.strip() or not any(h.strip() for h in page.h1):
        found.append(f"{rel}: no title or no h1 (title {page.title!r}, h1 {page.h1})")
    for img in page.images:
        if img["width"] <= 0:
            found.append(f"{rel}: image {img['src'][:120]} does not show")
    return found


def _http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return reply.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_smoke_site_shows_pages_charts_notebooks_and_evidence(smoke_site, lab, browser):
    pages = browse(smoke_site, browser)
    demo = pages["00_demo.html"]
    assert [i["src"].rpartition("/")[2] for i in demo.images] == ["bytes.svg"]
    assert any(link.endswith("/notebooks/00_demo.html") for link in demo.links)
    assert any(link.endswith("/outputs/00_demo/smoke/index.html") for link in demo.links)
    assert any(link.endswith("/outputs/00_demo/smoke/runs/index.html") for link in demo.links)
    notebook = pages["notebooks/00_demo.html"]
    assert notebook.h1[0].startswith("Demo")
    assert [i["src"][:22] for i in notebook.images] == ["data:image/png;base64,"]
    index = pages["index.html"]
    assert any(link.endswith("/notebooks/source/01_other.ipynb") for link in index.links)
    assert any(link.endswith("/outputs/00_demo/smoke/tables/T2.html") for link in index.links)
    assert "notebooks/01_other.html" not in pages  # never run: offered as the source file
    assert "outputs/00_demo/smoke/tables/T2.html" in pages
    assert "outputs/00_demo/smoke/runs/20260102T030405Z/tables/T2.html" in pages
    evidence = pages["outputs/00_demo/smoke/index.html"]
    assert any(link.endswith("/notebooks/00_demo.html") for link in evidence.links)
    assert any(link.endswith("/outputs/00_demo/smoke/charts/index.html") for link in evidence.links)
    charts = pages["outputs/00_demo/smoke/charts/index.html"]
    assert any(link.endswith("/outputs/00_demo/smoke/charts/bytes.png") for link in charts.links)
    assert sorted(p.name for p in (lab / "docs").iterdir()) == ["src"]  # docs/ untouched
    assert [p.name for p in (lab / "site").iterdir()] == [PARAMS]  # no staging left behind


# Every table of a page, as laid out: how far it reaches past the page's content column and
# whether its scroll box has to scroll (what is past the edge is cut off from view).
OVERFLOW = """
(() => {
  const content = document.querySelector(".md-content__inner") || document.body;
  const edge = content.getBoundingClientRect().right;
  return [...document.querySelectorAll("table")].map(t => {
    const box = t.closest(".md-typeset__scrollwrap") || t.parentElement;
    return {head: t.rows[0].textContent.trim().slice(0, 60),
            past: Math.round(t.getBoundingClientRect().right - edge),
            scrolls: box.scrollWidth > box.clientWidth + 1};
  });
})()
"""


@pytest.mark.parametrize("width", [1400, 1024])
def test_the_index_tables_fit_the_page_width(smoke_site, browser, width):
    """The catalogue and the verdict table wrap inside the page: no column is cut off."""
    browser.set_width(width)
    try:
        with serve(smoke_site) as base:
            browser.load(base + "index.html")
            tables = browser.evaluate(OVERFLOW)
    finally:
        browser.set_width(1400)
    heads = [t["head"] for t in tables]
    assert any(h.startswith("id") for h in heads) and any(h.startswith("claim") for h in heads)
    wide = [t for t in tables if t["past"] > 1 or t["scrolls"]]
    assert wide == [], f"tables wider than the page at {width} px: {wide}"


def test_a_broken_page_fails_the_build_and_keeps_the_previous_site(smoke_site, lab):
    before = sorted(p.relative_to(smoke_site) for p in smoke_site.rglob("*"))
    template = lab / "docs" / "src" / "00_demo.md"
    good = template.read_text()
    try:
        template.write_text(good + "\nSee [the appendix](appendix.md).\n")
        with pytest.raises(LabError, match=r"mkdocs build failed: .*appendix\.md"):
            site.build(PARAMS, root=lab)
    finally:
        template.write_text(good)
    assert sorted(p.relative_to(smoke_site) for p in smoke_site.rglob("*")) == before
    assert [p.name for p in (lab / "site").iterdir()] == [PARAMS]


def test_the_browser_check_sees_a_missing_image_a_dead_link_and_a_wrong_anchor(tmp_path, browser):
    (tmp_path / "index.html").write_text(
        '<!doctype html><title>t</title><h1 id="top">t</h1><img src="chart.svg" alt="c">'
        '<a href="gone.html">gone</a> <a href="other.html#nowhere">other</a> <a href="#top">up</a>'
    )
    (tmp_path / "other.html").write_text("<!doctype html><title>o</title><h1>o</h1>")
    with pytest.raises(AssertionError) as err:
        browse(tmp_path, browser)
    report = str(err.value)
    assert report.startswith("3 problems")
    assert "index.html: image http://127.0.0.1:" in report and "chart.svg does not show" in report
    assert "gone.html answers 404" in report
    assert "other.html#nowhere: no #nowhere on that page" in report
