"""The documentation site (issue 45): every results page is reachable from the nav and the results index,
every page of docs/ is in the nav, and the README stays a short front door whose links resolve.
`make docs` checks links and anchors in full (mkdocs build --strict); these checks need no mkdocs."""

import re
from pathlib import Path

import pytest
import yaml

from tests.scripts_import import load_script

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
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert pages - set(nav()) == set()
    assert [p for p in nav() if not (DOCS / p).is_file()] == []


def test_no_page_includes_another_file():
    """The pages read whole on GitHub as in the site (issue 73): a pymdownx.snippets include (`--8<--`) shows
    there as the raw line. A generated table sits in its page between marker comments (scripts/docs/page_block.py)."""
    pages = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
    raw = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for p in pages
           for n, line in enumerate(p.read_text().splitlines(), 1) if line.lstrip().startswith("--8<--")]
    assert raw == [], "write the table into the page between page_block.py's markers instead: " + "; ".join(raw)
    assert "pymdownx.snippets" not in (ROOT / "mkdocs.yml").read_text()


def test_the_readme_is_short_and_its_links_resolve():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    assert text.startswith("# relmt\n\n```bash\nmake train ") and "\nmake test " in text.split("```")[1]
    links = [t.split("#")[0] for t in re.findall(r"\]\(([^)]+)\)", text) if not t.startswith("http")]
    assert links and [t for t in links if not (ROOT / t).exists()] == []


# --- issue 57: the home page's headline table, long code lines, the built site ------------------------------

def test_the_home_page_has_the_readmes_headline_table():
    """docs/index.md's table is README.md's, copied with its links rewritten (scripts/docs/sync_headline.py)."""
    sync = load_script("sync_headline")
    index = (DOCS / "index.md").read_text()
    assert index == sync.synced((ROOT / "README.md").read_text(), index), \
        "docs/index.md's headline table differs from README.md's: run python scripts/docs/sync_headline.py"


def test_the_headline_links_are_rewritten_for_the_site():
    sync = load_script("sync_headline")
    readme = "## Headline results\n\n| q | page |\n|---|---|\n| a | [x](docs/results/x.md#top), [y](https://y) |\n"
    index = "# relmt\n\n## Headline results\n\n| old |\n|---|\n\nafter\n"
    assert sync.synced(readme, index) == ("# relmt\n\n## Headline results\n\n| q | page |\n|---|---|\n"
                                          "| a | [x](results/x.md#top), [y](https://y) |\n\nafter\n")
    with pytest.raises(ValueError, match="outside docs/"):
        sync.synced(readme.replace("docs/results/x.md", "data/README.md"), index)


def test_code_blocks_wrap_their_long_lines():
    """The five commands end in hydra.run.dir=runs/mine: a code line wraps instead of hiding its end."""
    css = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["extra_css"]
    assert "stylesheets/extra.css" in css
    rule = re.search(r"\.md-typeset pre > code \{([^}]*)\}", (DOCS / "stylesheets/extra.css").read_text())
    assert rule and "white-space: pre-wrap" in rule.group(1)


def test_the_built_site_renders_the_config_fields(tmp_path):
    """mkdocs (the docs extra) builds the site: the API page's config schemas show their fields, the config
    reference its keys, and every page loads the extra stylesheet. `make docs` checks links (--strict)."""
    pytest.importorskip("mkdocstrings")
    from mkdocs.commands.build import build
    from mkdocs.config import load_config

    build(load_config(str(ROOT / "mkdocs.yml"), site_dir=str(tmp_path), strict=False))
    api = (tmp_path / "api/index.html").read_text()
    assert 'id="relmt.config.Config.threads"' in api and 'id="relmt.config.ModelConfig.positions"' in api
    assert "<code>threads</code>" in (tmp_path / "config/index.html").read_text()
    assert "stylesheets/extra.css" in (tmp_path / "index.html").read_text()
