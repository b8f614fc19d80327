#!/usr/bin/env python
"""Sentences/s of each deployment route of one model on one host, in one run (issue 75; docs/deploying.md). Run it
alone on the machine.

    python scripts/bench/deploy_routes.py --checkpoint runs/deploy_toy/checkpoints/best.pt \\
        --out docs/results/performance/deploy_routes.json --md docs/results/performance/deploy_routes.md \\
        --page docs/deploying.md

The model must be exportable to CTranslate2 (model.relative_share_heads=true): `make train` with that override
(`.venv/bin/relmt-train model.relative_share_heads=true hydra.run.dir=runs/deploy_toy`). Every route decodes with
Argos's settings, which it cannot change: beam 4, length penalty 0.2 as |y|^0.2, 1 to 256 tokens; every process
with one thread; sources are the toy test set's (data.toy seed 1). The routes:
- relmt-serve (--engines: torch, aoti and ctranslate2; aoti compiles its graphs once, as the server starts):
  POST /v1/translate and LibreTranslate's POST /translate (through libretranslatepy), one sentence per request
  from one client, and --batch sentences per request;
- argostranslate in its own process, the package from relmt-export format=argos installed, one
  translate() call per sentence (its API takes one text), ARGOS_COMPUTE_TYPE float32 and auto (its default);
- LibreTranslate 1.9 (.venv-libretranslate, `make test` builds it) serving the package: POST /translate through
  libretranslatepy, one sentence per request, and --batch per request (q a list);
- CTranslate2 from one's own code: Translator.translate_batch on the package's model/, one sentence per call and
  --batch per call.
Outputs are checked: /translate's text equals /v1/translate's on the same server, and the float32 CTranslate2 routes
(argostranslate, LibreTranslate, relmt-serve engine=ctranslate2, one's own code) give one text per sentence.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts/bench"))

from serve_fairness import Server  # noqa: E402

sys.path.insert(0, str(ROOT / "scripts/docs"))
from page_block import replaced  # noqa: E402

from relmt.bench import command_line, hardware, markdown_table, page_head, write_json  # noqa: E402
from relmt.data.toy import generate  # noqa: E402
from relmt.export.argos import ARGOS_BEAM, ARGOS_LENPEN, ARGOS_MAX_TOKENS, export, offline_env  # noqa: E402

DECODE = [f"beam={ARGOS_BEAM}", f"lenpen={ARGOS_LENPEN}", "length_norm=power", "min_len=1", "max_len_a=0",
          f"max_len_b={ARGOS_MAX_TOKENS}"]
LT_VENV = ROOT / ".venv-libretranslate"
# the routes that run the package's CTranslate2 model in float32: one text per sentence among them
F32_CT2 = ("engine=ctranslate2", "COMPUTE_TYPE=float32", "LibreTranslate 1.9", "own code")

# Runs in argostranslate's process: installs the packages, then times translate() over the lines, once to warm up
ARGOS = """
import json, sys, time
from pathlib import Path
import argostranslate.package, argostranslate.translate
for f in sys.argv[2:]:
    argostranslate.package.install_from_path(Path(f))
lines = Path(sys.argv[1]).read_text().splitlines()
argostranslate.translate.translate(lines[0], "en", "de")
t = time.perf_counter()
out = [argostranslate.translate.translate(line, "en", "de") for line in lines]
print(json.dumps({"seconds": time.perf_counter() - t, "out": out}))
"""

# CTranslate2 from one's own code: the package's model and sentencepiece model
CT2 = """
import json, sys, time
import ctranslate2, sentencepiece as spm
model, batch = sys.argv[1], int(sys.argv[3])
lines = open(sys.argv[2]).read().splitlines()
sp = spm.SentencePieceProcessor(model_file=model + "/../sentencepiece.model")
tr = ctranslate2.Translator(model, device="cpu", intra_threads=1, compute_type="float32")
opts = dict(beam_size=BEAM, length_penalty=LENPEN, max_decoding_length=MAXLEN)
def run(chunk):
    res = tr.translate_batch([sp.encode(s, out_type=str) for s in chunk], **opts)
    return [sp.decode(r.hypotheses[0]) for r in res]
run(lines[:1])
t = time.perf_counter()
out = [s for i in range(0, len(lines), batch) for s in run(lines[i:i + batch])]
print(json.dumps({"seconds": time.perf_counter() - t, "out": out}))
""".replace("BEAM", str(ARGOS_BEAM)).replace("LENPEN", str(ARGOS_LENPEN)).replace("MAXLEN", str(ARGOS_MAX_TOKENS))


def child(python: Path | str, code: str, args: list[str], env: dict | None = None) -> dict:
    done = subprocess.run([str(python), "-c", code, *args], env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode:
        raise SystemExit(f"{python} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def timed(fn, chunks: list) -> tuple[float, list[str]]:
    fn(chunks[0][:1])  # warm up
    t = time.perf_counter()
    out = [s for chunk in chunks for s in fn(chunk)]
    return time.perf_counter() - t, out


def chunked(lines: list[str], size: int) -> list[list[str]]:
    return [lines[i:i + size] for i in range(0, len(lines), size)]


def relmt_serve_routes(checkpoint: Path, engine: str, one: list[str], many: list[str], batch: int,
                       log: Path) -> list[dict]:
    from libretranslatepy import LibreTranslateAPI

    server = Server(checkpoint, 1, log, f"engine={engine}", "device=cpu", *DECODE)
    try:
        lt = LibreTranslateAPI(server.url + "/")
        first = lt.languages()[0]  # the model's data.src and data.tgt
        src, tgt = first["code"], first["targets"][0]

        def v1(chunk):
            r = server.http.post("/v1/translate", json={"text": chunk})
            r.raise_for_status()
            return r.json()["translations"]

        def door(chunk):
            if len(chunk) == 1:
                return [lt.translate(chunk[0], src, tgt)]
            r = server.http.post("/translate", json={"q": chunk, "source": src, "target": tgt})
            r.raise_for_status()
            return r.json()["translatedText"]

        rows = []
        for name, fn in ((f"relmt-serve engine={engine}: POST /v1/translate", v1),
                         (f"relmt-serve engine={engine}: POST /translate (LibreTranslate's API)", door)):
            for per, lines in ((1, one), (batch, many)):
                seconds, out = timed(fn, chunked(lines, per))
                rows.append({"route": name, "per_request": per, "sentences": len(lines), "seconds": seconds,
                             "out": out})
        for a, b in ((rows[0], rows[2]), (rows[1], rows[3])):
            assert a["out"] == b["out"], f"{engine}: /translate and /v1/translate gave different texts"
        return rows
    finally:
        server.stop()


def libretranslate_routes(env: dict, one: list[str], many: list[str], batch: int, log: Path) -> list[dict]:
    from libretranslatepy import LibreTranslateAPI

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with open(log, "wb") as out:
        proc = subprocess.Popen([LT_VENV / "bin" / "libretranslate", "--host", "127.0.0.1", "--port", str(port),
                                 "--load-only", "en,de", "--disable-files-translation", "--threads", "1"],
                                stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        api, deadline = LibreTranslateAPI(f"http://127.0.0.1:{port}/"), time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"LibreTranslate exited {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                api.languages()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit(f"LibreTranslate not up in 120 s:\n{log.read_text()[-3000:]}") from None
                time.sleep(0.2)
        http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600)

        def many_lines(chunk):
            r = http.post("/translate", json={"q": chunk, "source": "en", "target": "de"})
            r.raise_for_status()
            return r.json()["translatedText"]

        rows = []
        for per, lines, fn in ((1, one, lambda c: [api.translate(c[0], "en", "de")]), (batch, many, many_lines)):
            seconds, out = timed(fn, chunked(lines, per))
            rows.append({"route": "LibreTranslate 1.9.6 serving the package: POST /translate", "per_request": per,
                         "sentences": len(lines), "seconds": seconds, "out": out})
        return rows
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", type=Path, default=ROOT / "runs/deploy_toy/checkpoints/best.pt")
    ap.add_argument("--one", type=int, default=200, help="sentences for the one-at-a-time routes")
    ap.add_argument("--many", type=int, default=500, help="sentences for the batched routes")
    ap.add_argument("--batch", type=int, default=32, help="sentences per request or call on the batched routes")
    ap.add_argument("--engines", default="torch,aoti,ctranslate2", help="relmt-serve's engines, comma-separated")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--md", type=Path)
    ap.add_argument("--page", type=Path, help="a page whose generated block gets the table (docs/deploying.md)")
    args = ap.parse_args()

    test = [src for src, _ in generate(seed=1, n_train=0, n_valid=0, n_test=max(args.one, args.many),
                                       n_test_long=0)["test"]]
    one, many = test[:args.one], test[:args.many]
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="deploy-routes-") as tmp:
        tmp = Path(tmp)
        packages = [export(args.checkpoint, tmp / f"{a}_{b}.argosmodel", source_lang=a, target_lang=b)
                    for a, b in (("en", "de"), ("de", "en"))]
        for engine in args.engines.split(","):
            rows += relmt_serve_routes(args.checkpoint, engine, one, many, args.batch, tmp / f"serve_{engine}.log")
        (tmp / "one.txt").write_text("\n".join(one) + "\n")
        for compute_type in ("float32", "auto"):
            r = child(sys.executable, ARGOS, [str(tmp / "one.txt"), str(packages[0])],
                      offline_env(tmp / f"argos_{compute_type}", compute_type))
            rows.append({"route": f"argostranslate 1.11, ARGOS_COMPUTE_TYPE={compute_type}: translate()",
                         "per_request": 1, "sentences": len(one), "seconds": r["seconds"], "out": r["out"]})
        home = tmp / "lt"
        env = offline_env(home, "float32")
        subprocess.run([LT_VENV / "bin" / "python", "-c", "import sys, pathlib, argostranslate.package as p\n"
                        "for f in sys.argv[1:]: p.install_from_path(pathlib.Path(f))", *map(str, packages)],
                       env=env, check=True, timeout=300)
        rows += libretranslate_routes(env, one, many, args.batch, tmp / "libretranslate.log")
        model = home / "data" / "argos-translate" / "packages" / "translate-en_de-1_0" / "model"
        (tmp / "many.txt").write_text("\n".join(many) + "\n")
        for per, name in ((1, "one.txt"), (args.batch, "many.txt")):
            r = child(sys.executable, CT2, [str(model), str(tmp / name), str(per)])
            rows.append({"route": "CTranslate2 from one's own code: translate_batch", "per_request": per,
                         "sentences": len(one) if per == 1 else len(many), "seconds": r["seconds"], "out": r["out"]})

    float32 = [r for r in rows if r["per_request"] == 1 and any(k in r["route"] for k in F32_CT2)]
    agree = all(r["out"] == float32[0]["out"] for r in float32)
    for r in rows:
        r["sentences_per_s"] = r["sentences"] / r["seconds"]
    hw = hardware()
    table = markdown_table(rows, [("route", "route"), ("per_request", "sentences per request or call"),
                                  ("sentences", "sentences"), ("sentences_per_s", "sentences/s")])
    print(table)
    print(f"float32 CTranslate2 routes, one sentence at a time, give the same texts: {agree}")
    payload = {"command": command_line(), "hardware": hw, "checkpoint": str(args.checkpoint), "decode": DECODE,
               "float32_ct2_routes_agree": agree,
               "rows": [{k: v for k, v in r.items() if k != "out"} for r in rows]}
    if args.out:
        write_json(args.out, payload)
    if args.md:
        args.md.write_text(
            page_head("Deployment routes: sentences/s on one host (issue 75)", hw, payload["command"]) +
            f"- model: {args.checkpoint}; every route at Argos's decoding "
            f"({' '.join(DECODE)}), one thread per process\n\n{table}\n\n"
            f"The float32 CTranslate2 routes (relmt-serve engine=ctranslate2, argostranslate float32, LibreTranslate, "
            f"one's own code), one sentence at a time, give the same text for every sentence: **{agree}**. "
            "/translate gave /v1/translate's text on every relmt-serve engine (checked).\n")
    if args.page:
        page = args.page.read_text()
        args.page.write_text(replaced(page, "scripts/bench/deploy_routes.py",
                                      f"{table}\n\n{hw.get('cpu')}, {hw.get('cpu_count')} cores, {hw.get('date')}. "
                                      f"The float32 CTranslate2 routes gave one text per sentence: {agree}."))


if __name__ == "__main__":
    main()
