"""The "Headline results" table of docs/index.md, copied from README.md, where it is edited.

GitHub cannot include one file in another, so the README holds the table and this script copies it into the
site's home page, its links rewritten from the repository's root to docs/ (`docs/results/x.md` becomes
`results/x.md`). tests/test_docs_site.py fails when the two tables differ.

    python scripts/docs/sync_headline.py            # rewrites the table in docs/index.md
    python scripts/docs/sync_headline.py --check    # exits 1 if docs/index.md's table differs
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
INDEX = ROOT / "docs" / "index.md"
HEADING = "## Headline results"
LINK = re.compile(r"\]\(([^)\s]+)\)")


def table_span(lines: list[str], name: str) -> tuple[int, int]:
    """[start, end) of the first table after the heading: its consecutive lines that start with '|'."""
    if HEADING not in lines:
        raise ValueError(f"{name}: no '{HEADING}' heading")
    start = lines.index(HEADING) + 1
    while start < len(lines) and not lines[start].startswith("|"):
        if lines[start].startswith("#"):
            raise ValueError(f"{name}: no table under '{HEADING}'")
        start += 1
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    if end == start:
        raise ValueError(f"{name}: no table under '{HEADING}'")
    return start, end


def site_link(target: str) -> str:
    """A README link as docs/index.md writes it: relative to docs/. A link outside docs/ cannot resolve in
    the site (mkdocs --strict fails on it), so the README's table may not hold one."""
    if target.startswith(("http://", "https://", "#")):
        return target
    if not target.startswith("docs/"):
        raise ValueError(f"README's headline table links {target}, outside docs/: the site cannot link it")
    return target[len("docs/"):]


def synced(readme: str, index: str) -> str:
    """docs/index.md's text with its headline table replaced by the README's, links rewritten."""
    src, dst = readme.splitlines(), index.splitlines()
    a, b = table_span(src, "README.md")
    c, d = table_span(dst, "docs/index.md")
    table = [LINK.sub(lambda m: f"]({site_link(m.group(1))})", line) for line in src[a:b]]
    return "\n".join(dst[:c] + table + dst[d:]) + ("\n" if index.endswith("\n") else "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/index.md's table differs")
    args = parser.parse_args()
    index = INDEX.read_text()
    new = synced(README.read_text(), index)
    if args.check:
        if new != index:
            print("docs/index.md's headline table differs from README.md's: run "
                  "python scripts/docs/sync_headline.py", file=sys.stderr)
            return 1
        return 0
    INDEX.write_text(new)
    print(f"wrote {INDEX}" if new != index else f"{INDEX} already has the README's table")
    return 0


if __name__ == "__main__":
    sys.exit(main())
