"""The GPU call's rehearsal (issue 73 §1; `make rehearse-gpu` runs it whole in CI): its scripts parse, the wheel
check finds what an install on the GPU machine would miss (an extra's packages, a second version, a tag Python
3.12 cannot take), the checker knows each call's phases, and the lane's whole-process entry point puts a script
on "CUDA". Reads nothing outside the repository."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile

import pytest

from tests.scripts_import import ROOT, load_script


def wheel(folder, name: str, version: str, requires: list[str], tag: str = "py3-none-any") -> None:
    dist = f"{name.replace('-', '_')}-{version}"
    with zipfile.ZipFile(folder / f"{dist}-{tag}.whl", "w") as z:
        meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
            f"Requires-Dist: {r}\n" for r in requires)
        z.writestr(f"{dist}.dist-info/METADATA", meta)


@pytest.fixture
def wheels_check(monkeypatch):
    check = load_script("wheels_check")
    monkeypatch.setattr(check, "image", lambda: {"anyio", "typing-extensions"})
    monkeypatch.setattr(check, "relmt_needs", lambda: ["uvicorn[standard]>=0.30", "fastapi"])
    monkeypatch.setattr(check, "CALL_NEEDS", [])
    return check


def test_the_wheel_check_follows_extras_and_names_what_the_gpu_machine_would_miss(tmp_path, wheels_check):
    wheel(tmp_path, "uvicorn", "0.54.0", ["h11>=0.8", 'httptools>=0.8; extra == "standard"',
                                          'watchfiles>=0.20; extra == "standard"', 'colorama; sys_platform == "win32"'])
    wheel(tmp_path, "fastapi", "0.165.0", ["anyio>=4", "opentelemetry-api>=1.44", 'jinja2; extra == "all"'])
    wheel(tmp_path, "h11", "0.16.0", [])
    wheel(tmp_path, "httptools", "0.9.0", [], tag="cp312-cp312-manylinux_2_17_x86_64")
    missing, problems, used = wheels_check.check(tmp_path)
    assert [m.split(" (asked")[0] for m in missing] == ["opentelemetry-api>=1.44",
                                                        'watchfiles>=0.20; extra == "standard"']
    assert "asked by uvicorn[standard]" in missing[1] and problems == []  # jinja2 (another extra), colorama: not asked
    assert used == ["fastapi", "h11", "httptools", "uvicorn"]


def test_the_wheel_check_refuses_two_versions_and_a_tag_the_gpu_python_cannot_take(tmp_path, wheels_check):
    wheel(tmp_path, "uvicorn", "0.54.0", [])
    wheel(tmp_path, "uvicorn", "0.53.0", [])
    wheel(tmp_path, "fastapi", "0.165.0", [], tag="cp311-cp311-manylinux_2_17_x86_64")
    wheel(tmp_path, "stray", "1.0", [])
    _, problems, _ = wheels_check.check(tmp_path)
    assert any("two wheels of uvicorn" in p for p in problems)
    assert any("fastapi-0.165.0-cp311" in p and "3.12" in p for p in problems)
    assert any("nothing asks for: stray" in p for p in problems)


def test_the_call_scripts_parse_and_the_checker_knows_each_calls_phases():
    for script in ("gpu_checks.sh", "call.sh", "rehearse.sh", "gpu_wheels.sh"):
        subprocess.run(["bash", "-n", str(ROOT / "scripts/gpu" / script)], check=True)
    check = load_script("rehearse_check")
    assert check.call_phases("1") == ["train43", "big", "conv", "total"]
    assert check.call_phases("2") == ["tests", "suite", "m30k", "total"]  # m30k, started first, ends last
    assert check.call_phases("3") == ["decode", "total"]
    assert subprocess.run(["bash", str(ROOT / "scripts/gpu/call.sh"), "4"], capture_output=True).returncode == 2


def test_the_lane_puts_a_whole_process_on_cuda():
    """scripts/gpu/lane/sitecustomize.py with RELMT_LANE=1: a script's tensors on "cuda" are the lane's, and torch's
    profiler asked for CUDA's activity records the CPU's without a warning per op."""
    code = ("import torch, warnings\n"
            "x = torch.ones(3, device='cuda')\n"
            "print(type(x).__name__, x.device, torch.cuda.is_available())\n"
            "with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, "
            "torch.profiler.ProfilerActivity.CUDA]) as p:\n"
            "    (x * 2).sum().item()\n"
            "print(len(p.key_averages()) > 0)\n")
    env = {**os.environ, "RELMT_LANE": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "scripts/gpu/lane")])}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["LaneTensor", "cuda:0", "True", "True"]
    assert "Failed to record CUDA event" not in done.stderr
    off = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                         env={**env, "RELMT_LANE": "0"}, capture_output=True, text=True, timeout=120)
    assert off.stdout.strip() == "False"
