"""A pytest plugin for the GPU calls (scripts/gpu/gpu_checks.sh loads it with -p): each failure's reason is
printed the moment the test fails, not only in pytest's final summary, which a run cut off by its time box
never reaches (the 2026-11-27 H200 calls named 135 failures and gave no reason for any)."""

from __future__ import annotations

TAIL = 30  # lines of each failure's report: the assertion, or the exception and where it was raised


def pytest_runtest_logreport(report) -> None:
    if report.failed:
        lines = report.longreprtext.splitlines()[-TAIL:]
        print(f"\n--- why {report.nodeid} failed ({report.when}):\n" + "\n".join(lines) + "\n---", flush=True)
