"""Build the lab's HTML site: `python -m sdq.lab.site --params default` -> site/<params>/.

The site is what people browse: the docs pages, the executed notebooks and the evidence behind
them, rendered by MkDocs (Material theme) with mkdocs-jupyter. It is built from the same sources
as docs/, never from anything else:

1. The Markdown pages are rendered by sdq.lab.docs into a scratch copy of the repository whose
   outputs/, notebooks/, docs/src/ and .git are links to the real ones, so building a site for
   any parameter set (smoke, say) never touches the committed docs/.
2. The MkDocs source folder gets those pages and their charts/, each executed notebook
   outputs/<stem>/<params>/<stem>.ipynb as notebooks/<stem>.ipynb (rendered as a page), the
   source notebook as a download where no executed one exists, and a copy of every evidence
   folder outputs/<stem>/<params>/ with an index page in each of its folders.
3. The pages' links that leave docs/ (`../notebooks/…`, `../outputs/…`) are rewritten to those
   places; a link to anything the site does not hold is an error naming the page and the link.
4. A small stylesheet (`CSS`) lets wide tables — the index's catalogue and verdicts, ten
   columns — wrap inside the page instead of running past its edge, where the theme would cut
   their last columns off behind a scroll bar.
5. `mkdocs build --strict` renders the HTML (any broken link or anchor it finds fails the
   build) into a staging folder beside site/<params>/, which is renamed into place only when
   the whole build succeeded: a half-written site never replaces the previous one.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from sdq import files
from sdq.errors import LabError, SdqError
from sdq.lab import docs
from sdq.lab.notebooks import notebook_paths
from sdq.lab.paths import repo_root, shown, shown_params

SITE_DIR = "site"
NOTEBOOKS = "notebooks"  # rendered executed notebooks, in the MkDocs source folder
SOURCES = "notebooks/source"  # source notebooks offered as downloads (never rendered)
EVIDENCE = "outputs"
# A Markdown link or image target: [text](target) / ![alt](target); targets hold no spaces.
LINK = re.compile(r"(!?\[[^\]]*\]\()([^)\s]+)(\))")
MKDOCS_TIMEOUT_S = 600
CSS_FILE = "stylesheets/sdq.css"
# The theme gives every header cell at least 5rem, pads cells by 1.25em and never breaks a link
# or a path: a ten-column table then runs past the page's edge, its last columns cut off behind
# a scroll bar. Here cells are padded less and wrap at spaces as before, while code (paths,
# file names) and the last column (free text: "why it differs", links to evidence) may also
# break inside a word, so a table fits the page's width; the content column may also use more
# of a wide window.
CSS = """\
.md-grid { max-width: 80rem; }
.md-typeset table:not([class]) { font-size: .62rem; }
.md-typeset table:not([class]) th { min-width: 0; }
.md-typeset table:not([class]) th,
.md-typeset table:not([class]) td { padding: .6em .7em; overflow-wrap: break-word; }
.md-typeset table:not([class]) a { overflow-wrap: break-word; }
.md-typeset table:not([class]) td:last-child,
.md-typeset table:not([class]) code { overflow-wrap: anywhere; word-break: normal; }
"""


@dataclass(frozen=True)
class Layout:
    """The repository being published and the parameter set whose outputs it shows."""

    root: Path
    params: str

    def out(self, stem: str) -> Path:
        return self.root / "outputs" / stem / shown_params(stem, self.params)

    def executed(self, stem: str) -> Path:
        return self.out(stem) / f"{stem}.ipynb"


def build(params: str = "default", root: Path | None = None, dest: Path | None = None) -> Path:
    """Build the site for `params` into `dest` (default site/<params>/); return `dest`."""
    layout = Layout(Path(root or repo_root()), params)
    dest = Path(dest or layout.root / SITE_DIR / params)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".staging-{dest.name}-", dir=dest.parent) as tmp:
        work = Path(tmp)
        pages = render_pages(layout, work / "repo")
        source = work / "src"
        assemble(layout, pages, source)
        config = write_config(layout, source, work / "html", work / "mkdocs.yml")
        run_mkdocs(config)
        files.replace_dir(work / "html", dest)
    return dest


def render_pages(layout: Layout, scratch: Path) -> Path:
    """Render docs/*.md for `layout.params` into scratch/docs/ (never the real docs/)."""
    scratch.mkdir(parents=True)
    # .git too: the pages warn when the code at HEAD is not the code that produced the outputs
    for name in ("outputs", "notebooks", ".git"):
        if (layout.root / name).exists():
            (scratch / name).symlink_to(layout.root / name)
    (scratch / "docs").mkdir()
    templates = layout.root / "docs" / "src"
    if templates.is_dir():
        (scratch / "docs" / "src").symlink_to(templates, target_is_directory=True)
    docs.render(layout.params, root=scratch)
    return scratch / "docs"


def assemble(layout: Layout, pages: Path, source: Path) -> None:
    """Fill the MkDocs source folder: evidence, notebooks, then pages with links rewritten."""
    source.mkdir(parents=True)
    stems = [p.stem for p in notebook_paths(layout.root / "notebooks")]
    for stem in stems:
        if layout.out(stem).is_dir():
            copy_evidence(layout, stem, source)
        if layout.executed(stem).is_file():
            _copy(layout.executed(stem), source / NOTEBOOKS / f"{stem}.ipynb")
        else:
            _copy(layout.root / "notebooks" / f"{stem}.ipynb", source / SOURCES / f"{stem}.ipynb")
    if (pages / "charts").is_dir():
        shutil.copytree(pages / "charts", source / "charts")
    (source / CSS_FILE).parent.mkdir(parents=True, exist_ok=True)
    (source / CSS_FILE).write_text(CSS, encoding="utf-8")
    resolve = site_resolver(source)
    for page in sorted(pages.glob("*.md")):
        text = rewrite_links(page.read_text(encoding="utf-8"), page.name, resolve)
        (source / page.name).write_text(text, encoding="utf-8")


def copy_evidence(layout: Layout, stem: str, source: Path) -> None:
    """outputs/<stem>/<params>/ into the site (its executed notebook is a page of its own),
    with an index.md in it and in every folder below it listing what is there, so that a link
    to any of its folders lands on a page."""
    out = layout.out(stem)
    shown_as = shown_params(stem, layout.params)  # a notebook run only by its own set: that set
    dst = source / EVIDENCE / stem / shown_as
    for path in sorted(out.rglob("*")):
        if not path.is_file() or path == layout.executed(stem):
            continue
        if path.name == "index.md":
            raise LabError(f"{shown(path, layout.root)}: the site writes its own index.md there")
        _copy(path, dst / path.relative_to(out))
    for folder in reversed([out, *sorted(p for p in out.rglob("*") if p.is_dir())]):  # leaves first
        rel = folder.relative_to(out).as_posix()
        where = f"outputs/{stem}/{shown_as}/" + ("" if rel == "." else f"{rel}/")
        note = ""
        if folder == out and layout.executed(stem).is_file():
            up = "../" * 3  # from outputs/<stem>/<params>/ back to the site's root
            note = f"The executed notebook: [{stem}]({up}{NOTEBOOKS}/{stem}.ipynb)."
        _write_index(dst / rel, f"Evidence: {where}", note)


def _write_index(folder: Path, title: str, note: str) -> None:
    """folder/index.md: the title, the note, then a link to each file and subfolder."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = [f"# {title}", ""] + ([note, ""] if note else [])
    for entry in sorted(folder.iterdir()):
        if entry.is_dir():
            lines.append(f"- [{entry.name}/]({entry.name}/index.md)")
        elif entry.name != "index.md":
            lines.append(f"- [{entry.name}]({entry.name})")
    (folder / "index.md").write_text("\n".join(lines) + "\n", encoding="utf-8")


def site_resolver(source: Path) -> Callable[[str], str | None]:
    """Map a repository path (`notebooks/x.ipynb`, `outputs/x/p/`) to its place in the site
    source folder, or None when the site does not hold it."""

    def resolve(path: str) -> str | None:
        if path.startswith(f"{NOTEBOOKS}/") and path.endswith(".ipynb") and path.count("/") == 1:
            name = path.rpartition("/")[2]
            for place in (f"{NOTEBOOKS}/{name}", f"{SOURCES}/{name}"):
                if (source / place).is_file():
                    return place
            return None
        if path.startswith(f"{EVIDENCE}/"):
            if path.endswith("/"):
                path += "index.md"
            return path if (source / path).is_file() else None
        return None

    return resolve


def rewrite_links(text: str, page: str, resolve: Callable[[str], str | None]) -> str:
    """Rewrite the links of a docs page that point out of docs/ (`../x`) to `resolve(x)`.

    Links inside docs/ (pages, charts, anchors) and absolute URLs are kept. A `#anchor` after
    the path is kept. A link out of docs/ that `resolve` cannot place is a LabError naming
    the page and the link."""

    def replace(match: re.Match) -> str:
        target = match.group(2)
        if not target.startswith("../"):
            return match.group(0)
        path, hash_, anchor = target[3:].partition("#")
        if path.startswith("../") or not path:
            raise LabError(f"{page}: link {target}: points outside the repository")
        place = resolve(path)
        if place is None:
            raise LabError(f"{page}: link {target}: the site holds no {path}")
        return f"{match.group(1)}{place}{hash_}{anchor}{match.group(3)}"

    return LINK.sub(replace, text)


def write_config(layout: Layout, source: Path, html: Path, path: Path) -> Path:
    """The MkDocs configuration: pages in order, notebooks rendered, every check on."""
    pages = sorted(source.glob("[0-9][0-9]_*.md"))
    notebooks = sorted((source / NOTEBOOKS).glob("*.ipynb"))
    nav: list = [{"Home": "index.md"}, *({_heading(p): p.name} for p in pages)]
    if notebooks:
        nav.append({"Executed notebooks": [f"{NOTEBOOKS}/{p.name}" for p in notebooks]})
    title = "sdq lab" if layout.params == "default" else f"sdq lab ({layout.params})"
    config = {
        "site_name": title,
        "docs_dir": str(source),
        "site_dir": str(html),
        "use_directory_urls": False,  # pages are files: the site also opens from file://
        "theme": {"name": "material", "font": False, "features": ["navigation.top"]},
        "plugins": [
            "search",
            {
                "mkdocs-jupyter": {
                    "include": [f"{NOTEBOOKS}/*.ipynb"],
                    "include_source": True,
                    "cache": False,
                    "execute": False,
                }
            },
        ],
        "extra_css": [CSS_FILE],
        "markdown_extensions": ["tables", {"toc": {"permalink": True}}],
        "nav": nav,
        "not_in_nav": f"/{EVIDENCE}/\n/{SOURCES}/\n",
        "validation": {
            "omitted_files": "warn",
            "absolute_links": "warn",
            "unrecognized_links": "warn",
            "anchors": "warn",
        },
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def _heading(page: Path) -> str:
    """The page's first `# ` heading (MkDocs misses it behind the generated-file comment)."""
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    return page.stem


def run_mkdocs(config: Path) -> None:
    """`mkdocs build --strict`: any warning (a broken link, a missing anchor) fails it.
    Not --quiet: it drops the warnings before strict mode counts them."""
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config)]
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    try:
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=MKDOCS_TIMEOUT_S, env=env
        )
    except subprocess.TimeoutExpired:
        raise LabError(f"mkdocs build did not finish in {MKDOCS_TIMEOUT_S} s") from None
    if done.returncode != 0:
        raise LabError(f"mkdocs build failed: {_first_problem(done.stdout + done.stderr)}")


def _first_problem(log: str) -> str:
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    for ln in lines:
        if ln.startswith(("WARNING", "ERROR")) or "Error" in ln:
            return ln
    return lines[-1] if lines else "no output"


def _copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sdq.lab.site", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--params", default="default", help="build from outputs/*/NAME/")
    parser.add_argument("--dest", type=Path, help="where to build (default site/NAME/)")
    args = parser.parse_args(argv)
    try:
        dest = build(args.params, dest=args.dest)
    except SdqError as exc:
        print(f"site: error: {exc}", file=sys.stderr)
        return exc.exit_code
    pages = sum(1 for _ in dest.rglob("*.html"))
    print(f"site: built {pages} pages from outputs/*/{args.params}/ into {dest}/index.html")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
