"""The import layers of relmt (STYLE.md §3) and every import that goes up one.

    python scripts/import_layers.py [ROOT]     # ROOT: a checkout (default: this one)

Each module of relmt/ belongs to a layer and may import only from its own layer or lower ones (report
skips train), so that translation never drags in the trainer and nothing at the bottom depends on
the model. Every
`import` and `from` statement counts, also those inside functions: a lazy import is still a
dependency. Prints the layer of each module, then each upward import; exits 1 if there is one.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

# Bottom up: (layer, name, module prefixes). A module belongs to the layer of its longest prefix.
LAYERS = [
    (1, "config, errors, runtime, host", ("relmt", "relmt.config", "relmt.errors", "relmt.runtime", "relmt.host")),
    (2, "data, model, dropout", ("relmt.data", "relmt.model", "relmt.dropout")),
    (3, "checkpoint", ("relmt.checkpoint",)),
    (4, "decode, evaluate, export", ("relmt.decode", "relmt.evaluate", "relmt.export")),
    (5, "train", ("relmt.train",)),
    (6, "report", ("relmt.report",)),
    (7, "cli", ("relmt.cli",)),
    (8, "serve", ("relmt.serve",)),  # relmt-serve: on cli's argument parsing and checks, never on train
    # bench uses private torch APIs and serves scripts/ only: above everything, so no module may import it
    (9, "tools for scripts/ (bench)", ("relmt.bench",)),
]
# Layers that a layer may not import although they are lower: reading and reporting runs stands on
# checkpoints, decoding and metrics, never on the trainer (STYLE.md §3); so does serving.
SKIPS = {6: {5}, 8: {5}}


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    target: str  # the relmt module it imports
    line: int

    def __str__(self) -> str:
        return (f"{self.module} (layer {layer(self.module)}) imports {self.target} "
                f"(layer {layer(self.target)}) at line {self.line}")


def layer(module: str) -> int:
    """The layer of a relmt module, by the longest matching prefix."""
    best, best_len = 0, -1
    for number, _, prefixes in LAYERS:
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best_len:
                best, best_len = number, len(p)
    if best_len < 0:
        raise ValueError(f"{module}: not a relmt module, or in no layer of scripts/import_layers.py")
    return best


def module_name(path: Path, root: Path) -> str:
    """relmt/decode/beam.py -> relmt.decode.beam; relmt/data/__init__.py -> relmt.data."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(source: str, module: str, is_package: bool, known: set[str]) -> list[Import]:
    """Every relmt module that `source` imports, at any depth (functions included). `from a import b`
    names the module a.b when that is a module of the package (`known`), else a itself."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package of `module`
                package = module.split(".") if is_package else module.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join(package + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        found += [Import(module, t, node.lineno) for t in dict.fromkeys(targets)
                  if t == "relmt" or t.startswith("relmt.")]
    return found


def package_imports(root: Path) -> list[Import]:
    """The relmt imports of every module under root/relmt."""
    files = sorted((root / "relmt").rglob("*.py"))
    known = {module_name(f, root) for f in files}
    return [imp for f in files
            for imp in imports(f.read_text(encoding="utf-8"), module_name(f, root), f.name == "__init__.py", known)]


def upward(found: list[Import]) -> list[Import]:
    """The imports that go up a layer, or down into one the importer skips (SKIPS)."""
    return [imp for imp in found if layer(imp.target) > layer(imp.module)
            or layer(imp.target) in SKIPS.get(layer(imp.module), ())]


def main(root: Path) -> int:
    found = package_imports(root)
    modules = sorted({module_name(f, root) for f in (root / "relmt").rglob("*.py")}, key=lambda m: (layer(m), m))
    print("| layer | name | modules |\n|---|---|---|")
    for number, name, _ in LAYERS:
        skips = "".join(f" (not layer {s})" for s in sorted(SKIPS.get(number, ())))
        print(f"| {number} | {name}{skips} | {', '.join(m for m in modules if layer(m) == number)} |")
    bad = upward(found)
    print(f"\n{len(bad)} upward import(s) among {len(found)} imports of relmt modules" + (":" if bad else ""))
    for imp in bad:
        print(f"  {imp}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1]))
