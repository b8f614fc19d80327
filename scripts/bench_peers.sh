#!/usr/bin/env bash
# relmt beside OpenNMT-py 3.5.1, eole 0.6.4, HF transformers Marian and CTranslate2 4.8.5, measured
# side by side on this machine in one run (issue 14), written to docs/results/perf_cpu.md and .json.
#
#   scripts/bench_peers.sh                       # all peers, 2 interleaved repeats (about an hour)
#   PEERS="onmt" REPEATS=1 scripts/bench_peers.sh
#
# 1. Installs each peer into its own virtual environment under $SCRATCH (default /tmp/relmt-peers),
#    from the package registry, once (a stamp file marks a finished install). Versions and quirks:
#    - OpenNMT-py 3.5.1 pins torch<2.3, so it goes in with --no-deps beside torch 2.13.0 and its
#      run-time needs; CTranslate2 4.8.5 shares its environment (for the converter).
#    - eole 0.6.4 with torch 2.13.0 and aiohttp.
#    - transformers (MarianMTModel) with torch 2.13.0.
#    torch==2.13.0 is installed explicitly: a CPU wheel of it lies on this project's machines, while a
#    bare `torch` pulls a multi-GB CUDA build.
# 2. Runs scripts/bench_peers.py in relmt's .venv (`make test` or `make train` builds it), which
#    generates the peer corpus with $PEER_GEN (default ../shared/bench/make_peer_corpus.py, present
#    on this project's machines only), trains and decodes with every toolkit, and writes the tables.
# Run nothing else on the machine meanwhile.
set -euo pipefail
cd "$(dirname "$0")/.."
SCRATCH=${SCRATCH:-/tmp/relmt-peers}
PEERS=${PEERS:-onmt eole marian}
REPEATS=${REPEATS:-2}
PEER_GEN=${PEER_GEN:-../shared/bench/make_peer_corpus.py}
PYTHON=${PYTHON:-python3}
mkdir -p "$SCRATCH"

install() {  # name, then pip argument lists separated by ';'
    local name=$1; shift
    [ -f "$SCRATCH/$name/.installed" ] && return 0
    echo "installing $name into $SCRATCH/$name"
    rm -rf "${SCRATCH:?}/$name"
    "$PYTHON" -m venv "$SCRATCH/$name"
    local pip="$SCRATCH/$name/bin/pip"
    "$pip" install --quiet --upgrade pip
    local args=()
    for word in "$@"; do
        if [ "$word" = ";" ]; then "$pip" install --quiet "${args[@]}"; args=(); else args+=("$word"); fi
    done
    [ ${#args[@]} -eq 0 ] || "$pip" install --quiet "${args[@]}"
    touch "$SCRATCH/$name/.installed"
}

for peer in $PEERS; do
    case $peer in
        onmt) install onmt torch==2.13.0 ";" --no-deps OpenNMT-py==3.5.1 ";" ctranslate2==4.8.5 configargparse \
                  pyyaml sacrebleu 'pyonmttok>=1.37,<2' rapidfuzz six spacy pyahocorasick fasttext-wheel ;;
        eole) install eole eole==0.6.4 torch==2.13.0 aiohttp ;;
        marian) install marian torch==2.13.0 ";" transformers sentencepiece ;;
        *) echo "unknown peer: $peer (onmt, eole or marian)" >&2; exit 2 ;;
    esac
done

# shellcheck disable=SC2086
.venv/bin/python scripts/bench_peers.py --scratch "$SCRATCH" --generator "$PEER_GEN" --peers $PEERS \
    --repeats "$REPEATS" "$@"
