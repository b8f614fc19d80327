"""docs/config.md: every config key, its type, its defaults and its help, generated from relmt/config.py.

The help of a field is its comment in relmt/config.py: the comment lines directly above the field and the
comment at the end of its line. The `relmt-train` default is the composed default config
(configs/config.yaml and its groups), the schema default the dataclass's. tests/test_config_reference.py
regenerates the page in memory and fails when the committed one differs.

    python scripts/docs/config_reference.py            # writes docs/config.md
    python scripts/docs/config_reference.py --check    # exits 1 if docs/config.md is out of date
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import io
import sys
import tokenize
import types
import typing
from enum import Enum
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from relmt import config as schema  # noqa: E402

PAGE = ROOT / "docs" / "config.md"
SOURCE = ROOT / "relmt" / "config.py"

INTRO = """\
# Config reference

<!-- Written by scripts/docs/config_reference.py from relmt/config.py: edit the field comments there, then
run `python scripts/docs/config_reference.py`. tests/test_config_reference.py fails when this page is stale. -->

Every key of the run config, one table per section, as you write it on the command line of
`relmt-train` and `relmt-prepare` (`relmt-train threads=2 model.positions=abs`). The
**default** is what `relmt-train` uses with no override: the schema in `relmt/config.py` filled by
`configs/config.yaml` and the groups it picks (`model=toy`, `data=toy`, `train=default`,
`decode=greedy`). Where the dataclass's own default differs, it follows as **schema**: a key has
that value when the group picked for its section (`model=base`, say) leaves it out. The help is the
field's comment in `relmt/config.py`; an empty one has none yet. The other commands take their own
`key=value` arguments (`relmt-translate --help`), and `relmt-translate` decodes with the
checkpoint's `decode.*` unless told otherwise.

`relmt-train --cfg job` prints the composed config of a command line without running it, e.g.
`relmt-train --cfg job experiment=multi30k_cpu` (`--cfg hydra` prints Hydra's own settings, such as
`hydra.run.dir`, the run directory). A key not in the schema, or a value of the wrong type, stops a
command before it starts.
"""


# --- the help: comments in relmt/config.py --------------------------------------------------------------

def _comments(source: str) -> dict[int, tuple[str, bool]]:
    """Line number -> (comment text, whether the comment is the whole line)."""
    out = {}
    code_lines = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            out[tok.start[0]] = (tok.string.lstrip("#").strip(), tok.start[0] not in code_lines)
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                              tokenize.ENCODING, tokenize.ENDMARKER):
            code_lines.update(range(tok.start[0], tok.end[0] + 1))
    return out


def field_help(source: str) -> dict[tuple[str, str], str]:
    """(class name, field or member name) -> the comment lines right above it and its end-of-line comment."""
    comments = _comments(source)
    out = {}
    for cls in ast.walk(ast.parse(source)):
        if not isinstance(cls, ast.ClassDef):
            continue
        for node in cls.body:
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                name = node.target.id
            elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                name = node.targets[0].id
            else:
                continue
            above, line = [], node.lineno - 1
            while line in comments and comments[line][1]:
                above.insert(0, comments[line][0])
                line -= 1
            after = [text for n, (text, whole) in comments.items()
                     if node.lineno <= n <= node.end_lineno and not whole]
            out[cls.name, name] = " ".join(above + after)
    return out


# --- types and values as written on the command line ---------------------------------------------------------

def _value(v) -> str:
    """A value as an override writes it (YAML): true, null, [0.9, 0.98], "" for the empty string."""
    if isinstance(v, Enum):
        return v.value
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, str):
        return v if v else '""'
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_value(x)}" for k, x in v.items()) + "}"
    return repr(v)


def _type(t) -> str:
    """A type in words; an enum links to its list of choices below the tables."""
    args = typing.get_args(t)
    if typing.get_origin(t) in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return " or ".join(_type(a) for a in inner) + (" or null" if len(inner) < len(args) else "")
    if isinstance(t, type) and issubclass(t, Enum):
        return f"[{t.__name__}](#{t.__name__.lower()})"
    if typing.get_origin(t) in (list, dict):
        return f"{typing.get_origin(t).__name__}[{', '.join(_type(a) for a in args)}]"
    return t.__name__


def _escape(text: str) -> str:
    """Text for a table cell: pipes escaped (they would end the cell), asterisks and < outside `code` too."""
    parts = text.split("`")
    for i in range(0, len(parts), 2):  # the even parts lie outside backticks
        parts[i] = parts[i].replace("*", r"\*").replace("<", "&lt;")
    return "`".join(parts).replace("|", r"\|")


def _schema_default(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory()


# --- the page ----------------------------------------------------------------------------------------------

def rows(cls: type, prefix: str, composed, helps: dict, enums: list, only=None) -> list[str]:
    """One table row per leaf key of the dataclass `cls` (or of its fields named in `only`); a nested
    dataclass adds its keys after the others. `enums` collects the enum types met on the way."""
    hints = typing.get_type_hints(cls)
    out, nested = [], []
    for f in dataclasses.fields(cls):
        if only is not None and f.name not in only:
            continue
        t, key = hints[f.name], prefix + f.name
        if dataclasses.is_dataclass(t):
            nested.append((t, key + ".", getattr(composed, f.name)))
            continue
        for a in (t, *typing.get_args(t)):
            if isinstance(a, type) and issubclass(a, Enum) and a not in enums:
                enums.append(a)
        default, fallback = _value(getattr(composed, f.name)), _value(_schema_default(f))
        if fallback != default:
            default = f"{default}`<br>schema: `{fallback}"
        out.append(f"| `{key}` | {_type(t)} | `{default}` | {_escape(helps.get((cls.__name__, f.name), ''))} |")
    for t, key, value in nested:
        out += rows(t, key, value, helps, enums)
    return out


HEADER = ["| key | type | default | help |", "|---|---|---|---|"]


def table(lines: list[str]) -> list[str]:
    """A table inside <div class="config-keys">, which docs/stylesheets/extra.css lays out (keys and values
    break at spaces only); md_in_html renders the table inside the div, and GitHub renders it as any table."""
    return ['<div class="config-keys" markdown>', "", *HEADER, *lines, "", "</div>"]


def render() -> str:
    """The page, from relmt/config.py and the composed default config."""
    helps = field_help(SOURCE.read_text())
    composed = schema.compose([])
    enums: list[type] = []
    sections, top = [], []
    hints = typing.get_type_hints(schema.Config)
    for f in dataclasses.fields(schema.Config):
        cls = hints[f.name]
        if not dataclasses.is_dataclass(cls):
            top.append(f.name)
            continue
        doc = " ".join((cls.__doc__ or "").split())
        lines = rows(cls, f.name + ".", getattr(composed, f.name), helps, enums)
        sections.append("\n".join([f"## {f.name}", "", _escape(doc), "", *table(lines)]))
    if top:  # the root's own keys (seed, out_dir)
        lines = rows(schema.Config, "", composed, helps, enums, only=top)
        sections.append("\n".join(["## Top level", "", "Keys of the root config itself.", "", *table(lines)]))
    choices = ["## Choices", "", "The values an enum-typed key takes, each with its comment in `relmt/config.py`."]
    for enum in enums:
        doc = " ".join((enum.__doc__ or "").split())
        doc = "" if doc.startswith("An enumeration") else doc  # Python's own text for an enum without a docstring
        choices += ["", f"### {enum.__name__}", ""] + ([_escape(doc), ""] if doc else [])
        for member in enum:
            text = helps.get((enum.__name__, member.name), "")
            choices.append(f"- `{member.value}`" + (f": {_escape(text)}" if text else ""))
    return "\n\n".join([INTRO.rstrip("\n"), *sections, "\n".join(choices)]) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/config.md differs, write nothing")
    parser.add_argument("--out", type=Path, default=PAGE)
    args = parser.parse_args()
    page = render()
    if args.check:
        current = args.out.read_text() if args.out.is_file() else ""
        if current != page:
            print(f"{args.out} is out of date: run python scripts/docs/config_reference.py", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(page)
    print(f"wrote {args.out}")
    bare = [row.split("`")[1] for row in page.splitlines() if row.startswith("| `") and row.endswith("|  |")]
    if bare:
        print(f"{len(bare)} keys have no comment in relmt/config.py: {' '.join(bare)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
