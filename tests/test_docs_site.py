"""The documentation site (issue 45): every results page is reachable from the nav and the results index,
every page of docs/ is in the nav, and the README stays a short front door whose links resolve.
`make docs` checks links and anchors in full (mkdocs build --strict); these checks need no mkdocs."""

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).parents[1]
DOCS = ROOT / "docs"


def nav_paths(entries) -> list[str]:
    """Every page path in mkdocs.yml's nav, however deep its sections."""
    out = []
    for entry in entries:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        out += nav_paths(value) if isinstance(value, list) else [value]
    return out


def nav() -> list[str]:
    return nav_paths(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])


def results_pages() -> set[str]:
    return {p.relative_to(DOCS).as_posix() for p in (DOCS / "results").rglob("*.md")}


def test_every_results_page_is_in_the_nav():
    missing = results_pages() - set(nav())
    assert not missing, f"add these to mkdocs.yml's nav (Results) and to docs/results.md: {sorted(missing)}"


def test_every_results_page_is_listed_in_the_results_index():
    listed = set(re.findall(r"\]\((results/[^)#]+\.md)\)", (DOCS / "results.md").read_text()))
    missing = results_pages() - listed
    assert not missing, f"add these to docs/results.md: {sorted(missing)}"


def test_every_page_of_docs_is_in_the_nav_and_every_nav_entry_exists():
    # docs/snippets/ holds tables that pages include (mkdocs.yml: exclude_docs, pymdownx.snippets), not pages
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md") if p.parent != DOCS / "snippets"}
    assert pages - set(nav()) == set()
    assert [p for p in nav() if not (DOCS / p).is_file()] == []


def test_every_snippet_is_included_by_a_page():
    included = set(re.findall(r'^--8<-- "([^"]+)"$', "\n".join(p.read_text() for p in DOCS.rglob("*.md")), re.M))
    assert {p.name for p in (DOCS / "snippets").glob("*.md")} == included


def test_the_readme_is_short_and_its_links_resolve():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    assert text.startswith("# relmt\n\n```bash\nmake train ") and "\nmake test " in text.split("```")[1]
    links = [t.split("#")[0] for t in re.findall(r"\]\(([^)]+)\)", text) if not t.startswith("http")]
    assert links and [t for t in links if not (ROOT / t).exists()] == []
