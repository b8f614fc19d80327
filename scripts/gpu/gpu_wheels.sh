#!/usr/bin/env bash
# Fills .whl/ (ignored by git; a GPU call carries it, and scripts/gpu/gpu_checks.sh installs it there) with the
# wheels of exactly the packages the GPU machine lacks. Its image has Python 3.12, torch 2.11 (CUDA 13),
# sentencepiece, sacrebleu, tensorboard, pyarrow, pandas, pyyaml, regex, joblib, tabulate and the rest of
# relmt's needs, and no network. What it lacks:
# - relmt's: hydra-core, omegaconf, antlr4-python3-runtime (published as source only: built into a wheel
#   here), hydra-joblib-launcher (configs/hydra/launcher), sacremoses, datasets with dill and multiprocess;
# - OpenNMT-py 3.5.1's, for scripts/bench/bench_train.py --onmt: OpenNMT-py itself (--no-deps: it pins torch<2.3),
#   configargparse and pyonmttok (a compiled CPython 3.12 manylinux wheel). The four packages that only its
#   unused data transforms import (spacy, fasttext, rapidfuzz, pyahocorasick) are stubbed instead
#   (scripts/peers/onmt_stubs), and ctranslate2, flask and waitress are not needed to train.
# The versions are the ones relmt's .venv runs here. Run it where pip reaches PyPI:
#   scripts/gpu/gpu_wheels.sh            # about 21 MB; then: du -sh .whl data/bench
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=.whl
PY=${PY:-python3}
mkdir -p "$DEST"
# relmt's serve extra (relmt-serve and its tests; 2026-11-28's call carried these by hand): fastapi, starlette,
# pydantic and pydantic-core (compiled), uvicorn with its `standard` extra (httptools and watchfiles compiled,
# websockets, python-dotenv) and fastapi's opentelemetry-api, which the image lacks. scripts/gpu/wheels_check.py
# follows every requirement against the image's packages and says what is still missing (make rehearse-gpu)
PURE=(hydra-core==1.3.8 omegaconf==2.3.1 hydra-joblib-launcher==1.2.0 sacremoses==0.2.0 datasets==5.2.0 dill==0.4.1
      multiprocess==0.70.19 OpenNMT-py==3.5.1 configargparse==1.9.0
      fastapi==0.165.0 starlette==1.10.0 pydantic==2.14.4 uvicorn==0.54.0 annotated-types==0.8.0 annotated-doc==0.0.7
      typing-inspection==0.4.5 typing_extensions==4.16.0 h11==0.16.0 anyio==4.16.0 click==8.5.1 idna==3.20
      opentelemetry-api==1.45.2 python-dotenv==1.2.4)
COMPILED=("pyonmttok==1.38.1" "pydantic-core==2.50.5" "httptools==0.9.0" "watchfiles==1.3.0" "websockets==17.4")
PLATFORM=(--python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
          --platform manylinux2014_x86_64)
"$PY" -m pip download -q --no-deps --only-binary=:all: "${PLATFORM[@]}" -d "$DEST" "${PURE[@]}" "${COMPILED[@]}"
"$PY" -m pip wheel -q --no-deps --no-binary=:all: -w "$DEST" antlr4-python3-runtime==4.9.3
ls -l "$DEST"
du -sh "$DEST"
