"""The docs' links lead somewhere, and every measurement kept in benchmarks/results/ is one the
docs cite: a relative link in README.md, docs/, an example's README or benchmarks/ must name a
file or directory that exists, and a file in benchmarks/results/ that no page names (by its path
or its file name) is a figure nobody reads, so it fails here too."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

FENCE = re.compile(r"^(`{3,}|~{3,}).*?^\1[ \t]*$", re.MULTILINE | re.DOTALL)
# a code span may wrap onto the next line, never past the end of its paragraph
CODE_SPAN = re.compile(r"(`+)(?!`)(?:(?!\n[ \t]*\n).)+?(?<!`)\1(?!`)", re.DOTALL)
# `[text](target)` and `![alt](target)`, with an optional title: `[text](target "title")`
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*([^()\s]+)(?:\s+\"[^\"]*\")?\s*\)")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def markdown_files() -> list[Path]:
    """README.md, docs/**/*.md, examples/**/README.md and benchmarks/**/*.md."""
    files = [ROOT / "README.md"]
    files += sorted((ROOT / "docs").rglob("*.md"))
    files += sorted((ROOT / "examples").rglob("README.md"))
    files += sorted((ROOT / "benchmarks").rglob("*.md"))
    return [f for f in files if f.is_file()]


def link_targets(text: str) -> list[str]:
    """The targets of a page's Markdown links, code blocks and code spans left out."""
    prose = CODE_SPAN.sub("", FENCE.sub("", text))
    return [m.group(1) for m in LINK.finditer(prose)]


def broken_links(page: Path) -> list[str]:
    """The relative link targets of `page` that name no file or directory; web, mail and other
    links with a scheme, and links to an anchor of the page itself, are not checked."""
    broken = []
    for target in link_targets(page.read_text(encoding="utf-8")):
        if SCHEME.match(target) or target.startswith("#"):
            continue
        path = unquote(target.split("#", 1)[0].split("?", 1)[0])
        where = ROOT / path.lstrip("/") if path.startswith("/") else page.parent / path
        if not where.exists():
            broken.append(target)
    return broken


def mentions(text: str, name: str) -> bool:
    """Whether `text` names the file `name`, alone or at the end of a path (`flower.json` is not
    named by `my-flower.json`)."""
    return re.search(rf"(?<![\w.-]){re.escape(name)}(?![\w-])", text) is not None


def test_the_link_finder_reads_links_and_skips_code() -> None:
    text = (
        'See [a](docs/a.md#part), ![fig](figures/f.png "title").\n'
        "`[not](code.md)` and `a\nb` and\n```\n[nor](block.md)\n```\n"
        "[web](https://flower.ai) [top](#top)\n"
        "A lone ` here.\n\n[after](c.md) `x`\n"
    )
    assert link_targets(text) == [
        "docs/a.md#part", "figures/f.png", "https://flower.ai", "#top", "c.md",
    ]  # fmt: skip


def test_a_link_to_a_missing_file_is_broken_and_one_to_an_existing_file_is_not(
    tmp_path: Path,
) -> None:
    (tmp_path / "there.md").write_text("x")
    page = tmp_path / "page.md"
    page.write_text("[ok](there.md#a) [dir](.) [gone](gone.md) [anchor](#a) [mail](mailto:x@y.z)")
    assert broken_links(page) == ["gone.md"]
    assert mentions("see `benchmarks/results/loop.json`", "loop.json")
    assert not mentions("see loop-gpu.json and my-loop.json", "loop.json")


def test_every_relative_link_in_the_docs_names_a_file_that_exists() -> None:
    pages = markdown_files()
    assert ROOT / "README.md" in pages and any(p.parent.name == "docs" for p in pages)
    broken = {
        str(page.relative_to(ROOT)): targets for page in pages if (targets := broken_links(page))
    }
    assert broken == {}


def test_every_file_in_benchmarks_results_is_cited_by_the_docs() -> None:
    text = "\n".join(page.read_text(encoding="utf-8") for page in markdown_files())
    results = sorted(p for p in RESULTS.rglob("*") if p.is_file())
    assert results, "benchmarks/results/ holds no file"
    uncited = [str(p.relative_to(ROOT)) for p in results if not mentions(text, p.name)]
    assert uncited == []
