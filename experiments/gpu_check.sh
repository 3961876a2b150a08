#!/usr/bin/env bash
# Issue 26 item 5: the N = 10,000 GPU check in one command (<= 8 min on one H200-class GPU).
#
#   bash experiments/gpu_check.sh --prepare [NAME==VERSION ...]  # here: data (+ wheels) to carry
#   bash experiments/gpu_check.sh [gpu_check.py options]         # on the GPU machine
#   bash experiments/gpu_check.sh --tiny [options]               # CPU smoke run, a minute or two
#
# --prepare (run where ../shared/data or $NTK_TT_DATA_DIR holds notMNIST, and pip can download)
# copies notmnist_sample_test.npz into experiments/data/ and downloads the named wheels, without
# their dependencies, for CPython $GPU_CHECK_PYTHON_VERSION (default 3.12, the device image's)
# on manylinux x86_64 into experiments/wheels/. Both folders are git-ignored: they travel to the
# device only when named in the device tool's carry (experiments/data, experiments/wheels).
#
# The run: no network, no install. The project is used in place (PYTHONPATH=repository root);
# a carried wheel is installed (--no-index, into $TMPDIR/gpu_check_site) only when its
# distribution is missing; the imports the run needs are checked first, and a run that does not
# see a GPU stops unless --tiny or --cpu is given. XLA_PYTHON_CLIENT_PREALLOCATE=false, so the
# allocator's peak_bytes_in_use is the run's own. Then experiments/gpu_check.py writes the JSON
# (default $OUT/gpu_check.json where $OUT is set, else experiments/results/gpu_check.json;
# --tiny: ${OUT:-/tmp}/gpu_check_tiny.json) and, where $OUT is set, the log $OUT/gpu_check.log.
# The Python run is killed after $GPU_CHECK_LIMIT seconds (default 470; its own budget guard,
# --budget, defaults to 450); the JSON then holds every stage finished before.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
PY=${PYTHON:-python3}
DATA_FILE=notmnist_sample_test.npz

if [[ ${1:-} == --prepare ]]; then
    shift
    src=""
    for dir in ${NTK_TT_DATA_DIR:-} ../shared/data; do
        if [[ -f $dir/$DATA_FILE ]]; then src=$dir/$DATA_FILE; break; fi
    done
    if [[ -z $src ]]; then
        echo "gpu_check.sh: error: $DATA_FILE not found in \$NTK_TT_DATA_DIR or ../shared/data;" \
             "set NTK_TT_DATA_DIR to the folder holding it." >&2
        exit 2
    fi
    mkdir -p experiments/data && cp -f "$src" experiments/data/ || exit 2
    carry=experiments/data
    if (($#)); then
        platforms=()
        for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 \
                 manylinux2014_x86_64 manylinux1_x86_64; do
            platforms+=(--platform "$p")
        done
        "$PY" -m pip download --no-deps --only-binary=:all: --implementation cp \
            --python-version "${GPU_CHECK_PYTHON_VERSION:-3.12}" "${platforms[@]}" \
            -d experiments/wheels "$@" || exit 2
        carry="$carry experiments/wheels"
    fi
    du -sh $carry
    echo "prepared; name in the device tool's carry: $carry"
    exit 0
fi

tiny=0 cpu=0 has_out=0 args=()
for arg in "$@"; do
    case $arg in
        --tiny) tiny=1; args+=("$arg") ;;
        --cpu) cpu=1 ;;
        --out|--out=*) has_out=1; args+=("$arg") ;;
        *) args+=("$arg") ;;
    esac
done
if ((!has_out)); then
    if ((tiny)); then out=${OUT:-/tmp}/gpu_check_tiny.json; args+=(--overwrite)  # scratch
    elif [[ -n ${OUT:-} ]]; then out=$OUT/gpu_check.json
    else out=experiments/results/gpu_check.json; fi
    args=(--out "$out" "${args[@]}")
fi

export XLA_PYTHON_CLIENT_PREALLOCATE=false
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
shopt -s nullglob
wheels=(experiments/wheels/*.whl)
if ((${#wheels[@]})); then
    missing=()
    for w in "${wheels[@]}"; do
        name=$(basename "$w"); name=${name%%-*}
        "$PY" -c 'import importlib.metadata as m, sys; m.version(sys.argv[1])' "$name" \
            2>/dev/null || missing+=("$w")
    done
    if ((${#missing[@]})); then
        site=${TMPDIR:-/tmp}/gpu_check_site
        echo "installing carried wheels: ${missing[*]}"
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$site" "${missing[@]}" || exit 3
        export PYTHONPATH="$PYTHONPATH:$site"
    fi
fi

GPU_CHECK_NEED_GPU=$((!tiny && !cpu)) "$PY" - <<'EOF' || exit 3
import importlib, os, sys
need = ["numpy", "scipy", "jax", "flax", "optax", "orbax.checkpoint", "diffrax", "equinox",
        "jaxtyping", "tqdm"]
bad = []
for name in need:
    try:
        importlib.import_module(name)
    except Exception as err:
        bad.append(f"{name} ({type(err).__name__}: {err})")
if bad:
    sys.exit("gpu_check.sh: error: cannot import " + "; ".join(bad) + ". Carry the wheels: run "
             "`bash experiments/gpu_check.sh --prepare NAME==VERSION ...` where pip can "
             "download, and name experiments/wheels in carry.")
import jax
kinds = [d.device_kind for d in jax.devices()]
print(f"jax {jax.__version__}, backend {jax.default_backend()}, devices {kinds}", flush=True)
if os.environ["GPU_CHECK_NEED_GPU"] == "1" and jax.default_backend() != "gpu":
    sys.exit(f"gpu_check.sh: error: JAX sees no GPU (backend {jax.default_backend()}); the "
             "N = 10,000 check takes hours on a CPU. Run it on a GPU machine, or add --tiny "
             "(a CPU smoke run) or --cpu (the full size anyway).")
EOF

log=/dev/null
[[ -n ${OUT:-} ]] && log=$OUT/gpu_check.log
timeout -k 15 "${GPU_CHECK_LIMIT:-470}" "$PY" experiments/gpu_check.py "${args[@]}" 2>&1 \
    | tee "$log"
exit "${PIPESTATUS[0]}"
