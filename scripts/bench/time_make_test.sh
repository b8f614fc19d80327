#!/usr/bin/env bash
# `make test`, timed (the brief: under 15 minutes on 2 cores). Builds .venv first if needed (not
# timed), then runs `make test` in this checkout with a JUnit report, and writes
# docs/results/performance/make_test/timing.json: the wall time, the tests passed, failed and skipped, the
# slowest tests and modules, the commit and the hardware. Run nothing else meanwhile.
#
#   scripts/bench/time_make_test.sh [KEEP]        # default docs/results/performance/make_test
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
KEEP=${1:-$ROOT/docs/results/performance/make_test}
mkdir -p "$KEEP"
report=$(mktemp --suffix .xml)
trap 'rm -f "$report"' EXIT
make .venv/.installed > /dev/null
built=$(date +%s.%N)
status=0
PYTEST_ADDOPTS="--junitxml=$report" make test || status=$?
end=$(date +%s.%N)
commit=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- relmt tests scripts configs Makefile pyproject.toml || echo "+changes")
"$ROOT/.venv/bin/python" - "$built" "$end" "$commit" "$report" "$KEEP" "$status" <<'EOF'
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from relmt.bench import hardware

built, end = (float(x) for x in sys.argv[1:3])
commit, report, keep, status = sys.argv[3], Path(sys.argv[4]), Path(sys.argv[5]), int(sys.argv[6])
cases = list(ET.parse(report).iter("testcase"))
outcome = {"passed": 0, "failed": 0, "skipped": 0}
for case in cases:
    kinds = {child.tag for child in case}
    outcome["failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed"] += 1
slowest = sorted(cases, key=lambda c: -float(c.get("time", 0)))[:30]
modules: dict[str, float] = {}  # each test module's summed seconds, where headroom is to be found
for case in cases:
    modules[case.get("classname")] = modules.get(case.get("classname"), 0.0) + float(case.get("time", 0))
timing = {"command": "scripts/bench/time_make_test.sh", "make_test": "make test (pytest -n auto --dist worksteal "
          "-m 'not exhaustive and not gpu')", "commit": commit, "hardware": hardware(),
          "make_test_seconds": round(end - built, 1), "exit_status": status, **outcome,
          "test_seconds_summed": round(sum(float(c.get("time", 0)) for c in cases), 1),
          "slowest": [{"test": f"{c.get('classname')}::{c.get('name')}", "seconds": round(float(c.get("time")), 1)}
                      for c in slowest],
          "modules": [{"module": m, "seconds": round(t, 1)} for m, t in sorted(modules.items(), key=lambda x: -x[1])[:30]]}
(keep / "timing.json").write_text(json.dumps(timing, indent=2) + "\n")
print(json.dumps({k: v for k, v in timing.items() if k not in ("slowest", "modules")}, indent=2))
EOF
exit "$status"
