#!/usr/bin/env bash
# relmt beside OpenNMT-py 3.5.1, eole 0.6.4, HF transformers Marian and CTranslate2 4.8.5, measured
# side by side on this machine in one run (issue 14), written to docs/results/performance/perf_cpu.md and .json.
#
#   scripts/peers/bench_peers.sh                       # all peers, 2 interleaved repeats (about an hour)
#   PEERS="onmt" REPEATS=1 scripts/peers/bench_peers.sh
#
# 1. Installs each peer into its own virtual environment (scripts/peers/install.sh says how).
# 2. Runs scripts/peers/bench_peers.py in relmt's .venv (`make test` or `make train` builds it), which
#    generates the peer corpus with $PEER_GEN (default ../shared/bench/make_peer_corpus.py, present
#    on this project's machines only), trains and decodes with every toolkit, and writes the tables.
# Run nothing else on the machine meanwhile.
set -euo pipefail
cd "$(dirname "$0")/../.."
PEERS=${PEERS:-onmt eole marian}
REPEATS=${REPEATS:-2}
PEER_GEN=${PEER_GEN:-../shared/bench/make_peer_corpus.py}
source scripts/peers/install.sh
for peer in $PEERS; do install_peer "$peer"; done

# shellcheck disable=SC2086
.venv/bin/python scripts/peers/bench_peers.py --scratch "$SCRATCH" --generator "$PEER_GEN" --peers $PEERS \
    --repeats "$REPEATS" "$@"
