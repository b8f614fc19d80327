"""scripts/bench/route_convergence.py (issue 58): two attention routes from one initialisation on the same
batches, and the first route again. On the CPU the chunked route (exact, as flex is on CUDA) against the
reference gives the same curve to float rounding, and a CPU repeat is bit-identical."""

from __future__ import annotations

import json
import random

from tests.test_scripts import run_script


def test_two_routes_from_one_initialisation_give_one_curve(tmp_path):
    rng = random.Random(0)
    words = [f"w{i}" for i in range(30)]
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for split, n in (("train", 200), ("valid", 5)):
        src = [" ".join(rng.choices(words, k=rng.randint(3, 12))) for _ in range(n)]
        (corpus / f"{split}.src").write_text("\n".join(src) + "\n")
        (corpus / f"{split}.tgt").write_text("\n".join(" ".join(reversed(s.split())) for s in src) + "\n")
    out, md = tmp_path / "c.json", tmp_path / "c.md"
    run_script("route_convergence.py", "--text-dir", str(corpus), "--vocab-size", "40", "--spm-model-type", "word",
               "--cache-dir", str(tmp_path / "cache"), "--device", "cpu", "--size", "tiny", "--routes", "chunked",
               "reference", "--updates", "6", "--warmup", "3", "--window", "3", "--tgt-tokens", "300",
               "--precision", "fp32", "--out", str(out), "--md", str(md))
    payload = json.loads(out.read_text())
    rows = {r["run"]: r for r in payload["rows"]}
    assert set(rows) == {"chunked", "reference", "chunked again"}
    assert rows["chunked again"]["identical_to_first"]  # the CPU is deterministic
    assert abs(rows["reference"]["over_first"] - 1) < 1e-3 and rows["reference"]["max_update_diff"] < 1e-3
    assert len(payload["curves"]["reference"]) == 6 and "Loss per target token by update" in md.read_text()
