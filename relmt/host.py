"""What a reported figure was measured on: date, CPU, cores, torch and git versions. Reports and
benchmarks print it beside every number; torch is not imported for it."""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().split("\n"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host() -> dict[str, str]:
    try:
        torch = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch = "not installed"
    try:
        git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False,
                             cwd=Path(__file__).parent).stdout.strip() or "unknown"
    except OSError:
        git = "unknown"
    return {"date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "cpu": cpu_model(),
            "cpu_count": str(os.cpu_count()), "torch": torch, "git": git}
