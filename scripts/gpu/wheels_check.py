#!/usr/bin/env python
"""Whether the wheels a GPU call carries (.whl/, scripts/gpu/gpu_wheels.sh) complete the GPU image's packages
(scripts/gpu/image_packages.txt) for what the call runs: relmt's dependencies with its `serve` extra, OpenNMT-py
3.5.1's for bench_train --onmt, and the pytest plugins gpu_checks.sh loads. It follows every requirement, extras
included (`uvicorn[standard]` needs its extra's packages), with Python 3.12's markers on Linux x86-64: a name that
neither the image nor a wheel holds is missing, and the call's `pip install --no-deps` would not say so (issue 73
§1: a call once lost its minutes to the wheels missing an extra). It also refuses two versions of one package
(the install there stops on them) and a wheel that Python 3.12 on manylinux x86-64 cannot install.

    python scripts/gpu/wheels_check.py .whl          # exit 1 and the missing names, or what the call will install
"""

from __future__ import annotations

import argparse
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

ROOT = Path(__file__).resolve().parents[2]
ENV = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux", "platform_system": "Linux",
       "platform_machine": "x86_64", "implementation_name": "cpython", "platform_python_implementation": "CPython",
       "os_name": "posix", "platform_release": "", "platform_version": "", "implementation_version": "3.12.3"}
# what gpu_checks.sh runs beside relmt: OpenNMT-py for bench_train --onmt (installed --no-deps: it pins torch<2.3;
# the transforms' imports it never uses are stubbed in scripts/peers/onmt_stubs), pytest's plugins
CALL_NEEDS = ["OpenNMT-py==3.5.1", "configargparse", "pyonmttok", "pytest", "pytest-xdist", "pytest-timeout"]
NO_DEPS = {"opennmt-py"}


def installable(tag) -> bool:
    """Whether CPython 3.12 on manylinux x86-64 takes a wheel tag."""
    abi3 = tag.abi == "abi3" and tag.interpreter.startswith("cp3") and int(tag.interpreter[3:]) <= 12
    interpreter = tag.interpreter in ("py3", "py312", "cp312") or abi3
    abi = tag.abi in ("none", "abi3", "cp312")
    platform = tag.platform == "any" or (tag.platform.startswith("manylinux") and tag.platform.endswith("x86_64"))
    return interpreter and abi and platform


def image() -> set[str]:
    lines = (ROOT / "scripts/gpu/image_packages.txt").read_text().splitlines()
    return {canonicalize_name(s) for s in (line.strip() for line in lines) if s and not s.startswith("#")}


def relmt_needs() -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return list(project["dependencies"]) + list(project["optional-dependencies"]["serve"])


def wheels(folder: Path) -> tuple[dict[str, tuple[str, list[str]]], list[str]]:
    """{name: (file, Requires-Dist lines)} and the problems: two versions of a name, a tag 3.12 cannot take."""
    found: dict[str, tuple[str, list[str]]] = {}
    problems = []
    for whl in sorted(folder.glob("*.whl")):
        name, version, _, tags = parse_wheel_filename(whl.name)
        name = canonicalize_name(name)
        if name in found:
            problems.append(f"two wheels of {name}: {found[name][0]} and {whl.name} (the install stops on them)")
        if not any(installable(t) for t in tags):
            problems.append(f"{whl.name}: no tag that Python 3.12 on manylinux x86-64 installs")
        with zipfile.ZipFile(whl) as z:
            meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
            message = Parser().parsestr(z.read(meta).decode("utf-8"))
        found[name] = (whl.name, message.get_all("Requires-Dist") or [])
    return found, problems


def check(folder: Path) -> tuple[list[str], list[str], list[str]]:
    """(missing requirements with who asked, problems, the wheels the call needs)."""
    have = image()
    found, problems = wheels(folder)
    missing, used = [], set()
    todo = [(Requirement(r), "relmt") for r in relmt_needs()] + [(Requirement(r), "the call") for r in CALL_NEEDS]
    seen: set[tuple[str, frozenset]] = set()
    while todo:
        req, by = todo.pop()
        name = canonicalize_name(req.name)
        if (name, frozenset(req.extras)) in seen:
            continue
        seen.add((name, frozenset(req.extras)))
        if name in found:
            used.add(name)
            if name in NO_DEPS:
                continue
            for line in found[name][1]:
                sub = Requirement(line)
                extras = req.extras or {""}
                if sub.marker is None or any(sub.marker.evaluate({**ENV, "extra": e}) for e in extras):
                    if sub.marker is not None and not req.extras and "extra" in str(sub.marker):
                        continue
                    todo.append((sub, f"{name}{'[' + ','.join(sorted(req.extras)) + ']' if req.extras else ''}"))
        elif name not in have:
            missing.append(f"{req} (asked by {by})")
    unused = sorted(set(found) - used)
    if unused:
        problems.append("wheels nothing asks for: " + ", ".join(unused))
    return sorted(set(missing)), problems, sorted(used)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path, nargs="?", default=ROOT / ".whl")
    args = ap.parse_args()
    if not args.folder.is_dir():
        sys.exit(f"{args.folder}: no such folder: run scripts/gpu/gpu_wheels.sh first")
    missing, problems, used = check(args.folder)
    for line in missing:
        print(f"missing on the GPU machine: {line}")
    for line in problems:
        print(f"problem: {line}")
    if missing or problems:
        sys.exit(1)
    print(f"wheels complete: the image plus {len(used)} wheels ({', '.join(used)}) hold every requirement")


if __name__ == "__main__":
    main()
