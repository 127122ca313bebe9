#!/usr/bin/env bash
# bench/gpu_wheels.sh [DIR]: run HERE, before a device run, to fill DIR (default .whl, ignored) with
# the wheels that bench/gpu_check.sh --wheels DIR installs on the lent GPU machine. That machine
# cannot fetch anything and our .venv cannot travel (1.5 GB, CPU-only torch, absolute paths), so
# there our code runs on the image's own python3 (Python 3.12, torch 2.11 with CUDA) with what the
# image lacks carried as wheels:
#   - locomesh itself, built from the files that travel (tracked and untracked-not-ignored ones);
#   - every runtime and test dependency of locomesh (pyproject's dependencies and its `test` extra,
#     their whole trees, markers read for Linux x86-64 CPython 3.12) that the image's package list
#     (IMAGE below) does not hold, pinned to the version installed in .venv, as manylinux or pure
#     wheels for CPython 3.12 x86-64. A walk stops at a package the image holds: the image's own
#     version and its dependencies are used there (gpu_check's `deps` step lists the pins they miss,
#     torch's ==2.13.0 among them: the image has 2.11). selenium is skipped (browser tests only).
#     A pin with no such wheel on the index (python-baseconv, varint, fastecdsa 2.3.2 in 2026-11) is
#     built here from its sdist: a pure one as is, one that compiles (fastecdsa: C against libgmp)
#     with a Python of the target version found here (python3.12, else pyenv's), for glibc 2.36+.
# It empties DIR's *.whl first (one version of each: two would stop the install), prints each
# wheel's size and the total, and exits 1 if DIR and the files that travel together exceed 60 MiB
# (the device tool carries 64 MiB at most). Needs the network and .venv.
#
#   bench/gpu_wheels.sh                         # then, with the device tool's `run`:
#   carry [".whl"], command `bench/gpu_check.sh --wheels .whl --out $OUT`
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
venv_py=$top/.venv/bin/python
target_python=3.12
limit_mib=60

# The Python packages on the device image (nvidia-h200, image 'cuda'), as the device tool's
# KINDS.md lists them (read there 2026-11-17). Carry one of these only if it must differ.
IMAGE="absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch
build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings
cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils
execnet filelock flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet
httpcore httpx humanize huggingface-hub hypothesis idna imageio iniconfig interface-meta jax
jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning
lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib
mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind
narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti
nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand
nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink
nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax
opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip
pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout
pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors
scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools
shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard
tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch
torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope triton typer
typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl
zipp"
# Not carried, with their own trees: the dashboard's browser tests need a browser the image lacks.
SKIP="selenium"

# The manylinux tags pip is offered (it matches each exactly); a wheel found under none of them is
# looked for again under every manylinux_2_N up to 2_35.
PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64)
MORE_PLATFORMS=()
for n in $(seq 5 35); do
    MORE_PLATFORMS+=("manylinux_2_${n}_x86_64")
done

usage() {
    echo "usage: bench/gpu_wheels.sh [DIR]   (default .whl, from the repository's root)" >&2
}

# Prints Name==version, one a line, for each package to carry; the pins left to the image on stderr.
WALK=$(cat <<'PY'
import importlib.metadata as md
import sys

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

target, image, skip = sys.argv[1], set(sys.argv[2].split()), set(sys.argv[3].split())
env = {"python_version": target, "python_full_version": target + ".0", "implementation_name": "cpython",
       "platform_python_implementation": "CPython", "sys_platform": "linux", "platform_system": "Linux",
       "platform_machine": "x86_64", "os_name": "posix"}
carry, left, missing, seen = {}, {}, [], set()
todo = [("locomesh", ("test",))]
while todo:
    name, extras = todo.pop()
    parent = md.distribution(name).metadata["Name"]
    for line in md.distribution(name).requires or []:
        req = Requirement(line)
        if req.marker and not any(req.marker.evaluate({**env, "extra": extra}) for extra in ("", *extras)):
            continue
        key = canonicalize_name(req.name)
        if key in skip:
            continue
        if key in image:
            left.setdefault(key, set()).add(f"{parent} {req.specifier or 'any'}")
            continue
        try:
            dist = md.distribution(req.name)
        except md.PackageNotFoundError:
            missing.append(f"{req} (of {parent})")
            continue
        if not req.specifier.contains(dist.version, prereleases=True):
            missing.append(f"{req} (of {parent}; .venv has {dist.version})")
        carry[key] = f"{dist.metadata['Name']}=={dist.version}"
        if (key, tuple(sorted(req.extras))) not in seen:
            seen.add((key, tuple(sorted(req.extras))))
            todo.append((req.name, tuple(sorted(req.extras))))
for key in sorted(left):
    print(f"gpu_wheels: from the image: {key} (wanted by {', '.join(sorted(left[key]))})", file=sys.stderr)
if missing:
    sys.exit("gpu_wheels: .venv lacks what locomesh needs: " + "; ".join(missing))
print("\n".join(carry[key] for key in sorted(carry)))
PY
)

# The size in bytes of the files that travel to the device (tracked and untracked-not-ignored),
# those under DIR aside (counted with the wheels).
travelling_bytes() {
    git -C "$top" ls-files -z --cached --others --exclude-standard | python3 -c '
import os, sys
skip = os.path.relpath(sys.argv[1], sys.argv[2]) + os.sep
paths = [p for p in sys.stdin.buffer.read().decode().split("\0") if p and not (p + os.sep).startswith(skip)]
print(sum(os.path.getsize(os.path.join(sys.argv[2], p)) for p in paths if os.path.isfile(os.path.join(sys.argv[2], p))))
' "$dir" "$top"
}

# Builds locomesh's wheel from a copy of the files that travel, so the checkout gets no build/ or
# egg-info from it.
build_locomesh() {
    mkdir "$tmp/src"
    git -C "$top" ls-files -z --cached --others --exclude-standard |
        (cd "$top" && tar --null --ignore-failed-read -T - -cf - 2>/dev/null) | tar -xf - -C "$tmp/src"
    "$venv_py" -m pip wheel -q --disable-pip-version-check --no-deps --no-build-isolation -w "$dir" "$tmp/src"
}

# The distribution names of DIR's wheels, normalized (lower case, `_` for runs of `-_.`), a line each.
wheel_names() {
    local f
    for f in "$dir"/*.whl; do
        [[ -e $f ]] || continue
        basename "$f" | cut -d- -f1 | tr 'A-Z' 'a-z' | sed 's/[-_.]\+/_/g'
    done | sort
}

download() {
    python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
        --python-version "$target_python" --implementation cp "$@" -d "$dir"
}

platform_args() {
    local p
    for p in "$@"; do
        printf -- '--platform\n%s\n' "$p"
    done
}

# download_all PLATFORM-ARGS... -- PIN...: downloads the pins in as few pip calls as it can (pip
# stops at the first pin it finds no wheel for: that one is set aside and the rest asked again);
# writes the pins set aside to $tmp/left, one a line.
download_all() {
    local args=() pins=() log=$tmp/download.log bad
    while [[ $1 != -- ]]; do args+=("$1"); shift; done
    shift
    pins=("$@")
    : >"$tmp/left"
    while ((${#pins[@]})); do
        download "${args[@]}" "${pins[@]}" 2>"$log" && return 0
        bad=$(sed -n 's/.*No matching distribution found for \([^ ]*\).*/\1/p' "$log" | head -1)
        if [[ -z $bad ]] || ! printf '%s\n' "${pins[@]}" | grep -qxF -- "$bad"; then
            cat "$log" >&2  # not a missing wheel (the network?): give up
            exit 1
        fi
        echo "$bad" >>"$tmp/left"
        mapfile -t pins < <(printf '%s\n' "${pins[@]}" | grep -vxF -- "$bad")
    done
}

# An interpreter of the target version here (a command, else pyenv's), for sdists that compile.
target_interpreter() {
    local py
    for py in "python$target_python" "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$target_python".*/bin/"python$target_python"; do
        if "$py" -c 'import sys; sys.exit(sys.version_info[:2] != tuple(map(int, sys.argv[1].split("."))))' \
            "$target_python" 2>/dev/null; then
            echo "$py"
            return 0
        fi
    done
    return 1
}

# For a pin with no wheel on the index, only an sdist: builds its wheel here. A pure one
# (py3-none-any) goes anywhere; one that compiles needs a Python of the target version here, and
# then links against this machine's glibc and shared libraries, which the image must also have.
build_sdist() {
    local pin=$1 py=$venv_py built
    target_interpreter >/dev/null && py=$(target_interpreter)
    rm -rf "$tmp/sdist" && mkdir "$tmp/sdist"
    "$py" -m pip wheel -q --disable-pip-version-check --no-deps --no-binary=:all: -w "$tmp/sdist" "$pin" \
        >"$tmp/sdist.log" 2>&1 || { cat "$tmp/sdist.log" >&2; return 1; }
    built=$(ls "$tmp/sdist"/*.whl)
    case $built in
        *-none-any.whl) ;;
        *-cp${target_python/./}-*linux_x86_64.whl)
            echo "gpu_wheels: $pin has no wheel: built here with $py ($(basename "$built"); it needs" \
                "$(ldd --version | head -1 | awk '{print $NF}')+ glibc and the libraries it links there)" >&2 ;;
        *) echo "gpu_wheels: $pin: built $(basename "$built"), which CPython $target_python x86-64 cannot load" \
               "(no Python $target_python here to build it with)" >&2
           return 1 ;;
    esac
    mv "$built" "$dir/"
}

main() {
    case ${1:-} in
        -h | --help) usage; exit 0 ;;
        -*) usage; exit 2 ;;
    esac
    (($# <= 1)) || { usage; exit 2; }
    cd "$top"
    mkdir -p "${1:-.whl}"
    dir=$(cd "${1:-.whl}" && pwd)
    [[ -x $venv_py ]] || { echo "gpu_wheels: no $venv_py (cli/dev sets it up)" >&2; exit 1; }
    rm -f "$dir"/*.whl
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT

    local pins base more pin left failed=()
    pins=$("$venv_py" - "$target_python" "$(tr '\n' ' ' <<<"$IMAGE")" "$SKIP" <<<"$WALK")
    mapfile -t base < <(platform_args "${PLATFORMS[@]}")
    mapfile -t more < <(platform_args "${PLATFORMS[@]}" "${MORE_PLATFORMS[@]}")
    echo "gpu_wheels: building locomesh's wheel into $dir" >&2
    build_locomesh
    echo "gpu_wheels: downloading $(wc -l <<<"$pins") wheels for CPython $target_python x86-64" >&2
    # shellcheck disable=SC2086
    download_all "${base[@]}" -- $pins
    mapfile -t left <"$tmp/left"
    if ((${#left[@]})); then
        echo "gpu_wheels: no wheel under the usual manylinux tags for ${left[*]}; trying manylinux_2_5..2_35" >&2
        download_all "${more[@]}" -- "${left[@]}"
        mapfile -t left <"$tmp/left"
    fi
    for pin in "${left[@]}"; do
        echo "gpu_wheels: no wheel at all for $pin: building it from its sdist" >&2
        build_sdist "$pin" || failed+=("$pin")
    done
    ((${#failed[@]} == 0)) || { echo "gpu_wheels: no wheel for: ${failed[*]}" >&2; exit 1; }

    local names wheels tree total
    names=$(wheel_names)
    if [[ -n $(uniq -d <<<"$names") ]]; then
        echo "gpu_wheels: two versions of: $(uniq -d <<<"$names" | tr '\n' ' ')" >&2
        exit 1
    fi
    (cd "$dir" && ls -lS --block-size=K -- *.whl | awk '{print "  " $5 "\t" $9}')
    wheels=$(cat "$dir"/*.whl | wc -c)
    tree=$(travelling_bytes)
    total=$((wheels + tree))
    awk -v n="$(wc -l <<<"$names")" -v w="$wheels" -v t="$tree" -v l="$limit_mib" 'BEGIN {
        printf "gpu_wheels: %d wheels, %.1f MiB; with the %.1f MiB of files that travel besides: %.1f MiB (limit %d MiB)\n",
            n, w / 1048576, t / 1048576, (w + t) / 1048576, l}' >&2
    if ((total > limit_mib * 1048576)); then
        echo "gpu_wheels: over $limit_mib MiB: the device tool would refuse the call" >&2
        exit 1
    fi
}

main "$@"
