# Sourced by scripts/peers/bench_peers.sh and scripts/peers/quality_peers.sh: `install_peer NAME` puts a peer toolkit into
# its own virtual environment under $SCRATCH (default /tmp/relmt-peers), from the package registry, once (a
# stamp file marks a finished install). Versions and quirks:
# - OpenNMT-py 3.5.1 pins torch<2.3, so it goes in with --no-deps beside torch 2.13.0 and its run-time needs
#   (flask and waitress for onmt_server, which scripts/bench/bench_serve.py drives);
#   CTranslate2 4.8.5 shares its environment (for the converter).
# - eole 0.6.4 with torch 2.13.0 and aiohttp.
# - transformers (MarianMTModel) with torch 2.13.0.
# torch==2.13.0 is installed explicitly: a CPU wheel of it lies on this project's machines, while a bare
# `torch` pulls a multi-GB CUDA build.
SCRATCH=${SCRATCH:-/tmp/relmt-peers}
PYTHON=${PYTHON:-python3}

install() {  # name, then pip argument lists separated by ';'
    local name=$1; shift
    [ -f "$SCRATCH/$name/.installed" ] && return 0
    echo "installing $name into $SCRATCH/$name"
    rm -rf "${SCRATCH:?}/$name"
    mkdir -p "$SCRATCH"
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

install_peer() {
    case $1 in
        onmt) install onmt torch==2.13.0 ";" --no-deps OpenNMT-py==3.5.1 ";" ctranslate2==4.8.5 configargparse \
                  pyyaml sacrebleu 'pyonmttok>=1.37,<2' rapidfuzz six spacy pyahocorasick fasttext-wheel flask waitress ;;
        eole) install eole eole==0.6.4 torch==2.13.0 aiohttp ;;
        marian) install marian torch==2.13.0 ";" transformers sentencepiece ;;
        *) echo "unknown peer: $1 (onmt, eole or marian)" >&2; exit 2 ;;
    esac
}
