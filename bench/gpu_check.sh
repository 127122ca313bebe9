#!/usr/bin/env bash
# bench/gpu_check.sh: the first thing to run when a GPU machine is lent. It measures our CUDA path
# in one go, each step under a time limit of its own:
#   1. the card: nvidia-smi's name, memory and driver, and torch's view of it (CUDA build, device);
#   2. the device tests (tests/test_devices.py, tests/test_node_config.py) with the GPU present;
#   3. bench/llama_throughput.py on the 20m and 150m presets on cuda:0: tokens/s and MFU;
#   4. bench/llama_daemons.py: two daemons training the llama task on the one GPU, whose
#      CPU-computed outer-step state hashes must agree;
#   5. bench/diloco_vs_ddp.py --task llama on the 20m preset's shapes (a CPU simulation: the
#      simulator has no device option), as many tokens as its time limit allows.
# `--dry-run` runs the same steps on the CPU at their smallest settings (the tiny preset, a few
# steps, one or two rounds), so that CI (.ci/run, stage gpu-dry-run) keeps this script working.
#
# Promises: it ends within its mode's budget (BUDGET_S) whatever hangs: a step over its limit is
# interrupted, then killed, and reported as timed out, and the next step runs; every figure in the
# summary names the card (or CPU) it was measured on. Under --out DIR (default $OUT, else
# ./gpu_check_out) it writes gpu_check.json, gpu_check.md and logs/ (one log a step, the
# daemons' own logs beside). It exits 1 if any step failed or timed out, 130 if interrupted.
#
#   bench/gpu_check.sh --wheels .whl --out "$OUT"  # on the GPU machine, after bench/gpu_wheels.sh here
#   bench/gpu_check.sh --dry-run --out /tmp/x      # anywhere, on the CPU
#
# It uses the repository's .venv (`--python` names another interpreter: a command, or a path from
# the repository's root); where .venv is absent it is set up as `cli/dev` does it (which needs the
# network). `--wheels DIR` is for the lent GPU machine, where .venv cannot travel and nothing can be
# fetched: the image's own `python3` (torch with CUDA; Python 3.12) is the interpreter unless
# `--python` names another, and two steps come first: `wheels` installs DIR's wheels (made here by
# bench/gpu_wheels.sh: locomesh and what the image lacks) into /tmp/locomesh-site, which every step
# then finds on PYTHONPATH (the benches' `import locomesh` and the daemons they start inherit it),
# and `deps` lists the pins of pyproject's tree that the image's own packages miss (its torch
# 2.11 against our ==2.13.0, say: listed in the summary, no failure) and fails if a package is absent.
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)

usage() {
    echo "usage: bench/gpu_check.sh [--dry-run] [--out DIR] [--wheels DIR] [--python PATH]" >&2
}

parse_args() {
    out=${OUT:-./gpu_check_out}
    dry=0
    py=
    wheels=
    while (($#)); do
        case $1 in
            --dry-run) dry=1 ;;
            --out) out=${2:?--out needs a folder}; shift ;;
            --wheels) wheels=${2:?--wheels needs a folder}; shift ;;
            --python) py=${2:?--python needs a path}; shift ;;
            -h | --help) usage; exit 0 ;;
            *) usage; exit 2 ;;
        esac
        shift
    done
    if [[ -n $wheels ]]; then
        py=${py:-python3}
        if ! compgen -G "$wheels/*.whl" >/dev/null; then
            echo "gpu_check: no wheels in $wheels (bench/gpu_wheels.sh makes them)" >&2
            exit 2
        fi
        wheels=$(cd "$wheels" && pwd)
    fi
    py=${py:-.venv/bin/python}
}

# Per mode: where things run, how big, and each step's limit in seconds. A mode's limits (venv's
# aside: that step runs only where .venv is absent) add up to at most its budget, so no step is
# squeezed by an earlier one that ran to its limit; the budget leaves room for one kill's grace.
configure() {
    declare -gA LIMIT
    if ((dry)); then
        mode=dry-run device=cpu BUDGET_S=330
        LIMIT=([venv]=240 [nvidia-smi]=10 [torch]=30 [tests]=60 [throughput-tiny]=45 [daemons]=120 [diloco]=60)
        presets=(tiny)
        throughput_args=(--steps 2 --batch-size 2 --context 32)
        test_args=(-k "not process and not rank and not participant and not worker")
        daemon_args=(--nodes 2 --rounds 2 --inner-steps 2 --batch 2 --eval-sequences 8 --deadline 60)
        diloco_preset=tiny
        diloco_args=(--workers 2 --rounds 1 --inner-steps 2 --batch 2 --eval-sequences 8 --warm-steps 0
                     --ddp-lr 3e-3 --only ddp,int8)
    else
        mode=gpu device=cuda:0 BUDGET_S=470
        LIMIT=([venv]=240 [nvidia-smi]=10 [torch]=25 [tests]=70 [throughput-20m]=45 [throughput-150m]=60
               [daemons]=145 [diloco]=110)
        presets=(20m 150m)
        throughput_args=()
        test_args=()
        daemon_args=(--nodes 2 --rounds 3 --inner-steps 30 --deadline 60)
        diloco_preset=20m
        diloco_args=(--workers 4 --rounds 2 --inner-steps 15 --batch 8 --eval-sequences 128 --warm-steps 0
                     --ddp-lr 6e-3 --only ddp,fp32,int8 --jobs 3 --threads 4)
    fi
    # Under --wheels, its two steps come on top, with their time.
    LIMIT+=([wheels]=45 [deps]=15)
    if [[ -n $wheels ]]; then
        BUDGET_S=$((BUDGET_S + LIMIT[wheels] + LIMIT[deps]))
    fi
}

# Runs "$@" under `timeout` (SIGINT first, so Python unwinds and stops its daemons), in the
# background so that a Ctrl-C or SIGTERM sent to this script reaches the step too.
limited() {
    local limit=$1 pid status
    shift
    timeout --signal=INT --kill-after=5 "$limit" "$@" &
    pid=$!
    trap 'interrupted=1; kill -INT "$pid" 2>/dev/null' INT TERM
    while true; do
        status=0
        wait "$pid" || status=$?
        kill -0 "$pid" 2>/dev/null || break  # still running: the wait was cut short by a signal
    done
    trap - INT TERM
    return "$status"
}

# One line of steps.tsv: name, status, exit code, seconds, limit, device, log, command.
record() {
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >>"$out/steps.tsv"
}

# run_step NAME DEVICE COMMAND...: runs the command under the step's limit (cut to what is left
# of the budget), its output in logs/NAME.log, and records how it went.
run_step() {
    local name=$1 dev=$2 log="logs/$1.log" start=$SECONDS limit status rc=0
    shift 2
    limit=$(step_limit "$name")
    if ((limit < 5)); then
        record "$name" no-time "" 0 "$limit" "$dev" "" "out of budget: $*"
        return 0
    fi
    echo "gpu_check: $name (limit ${limit} s, log $out/$log)" >&2
    limited "$limit" "$@" >"$out/$log" 2>&1 || rc=$?
    case $rc in
        0) status=passed ;;
        124 | 137) status=timed-out ;;
        *) status=failed ;;
    esac
    [[ -z $interrupted ]] || status=interrupted
    echo "gpu_check: $name $status after $((SECONDS - start)) s" >&2
    record "$name" "$status" "$rc" "$((SECONDS - start))" "$limit" "$dev" "$log" "$(printf '%q ' "$@")"
    [[ -z $interrupted ]] || finish 130
}

step_limit() {
    local limit=${LIMIT[$1]} left=$((deadline - SECONDS))
    if ((left < limit)); then
        limit=$left
    fi
    echo "$limit"
}

# The interpreter: .venv as carried over; where it is absent, cli/dev's own set-up (via its
# `test --version`, which installs and then only prints pytest's version).
ensure_python() {
    if command -v "$py" >/dev/null; then
        return 0
    fi
    if [[ $py == .venv/bin/python ]]; then
        run_step venv cpu cli/dev test --version
    else
        record venv failed "" 0 0 cpu "" "no interpreter at $py"
    fi
}

# Under --wheels: installs DIR's wheels into SITE, on PYTHONPATH for every step after, and checks
# pyproject's tree there.
SITE=/tmp/locomesh-site

step_wheels() {
    [[ -n $wheels ]] || return 0
    run_step wheels cpu bash -c 'rm -rf "$1" && "$2" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --disable-pip-version-check --upgrade --target "$1" "${@:3}" && echo "installed $(($# - 2)) wheels into $1"' \
        - "$SITE" "$py" "$wheels"/*.whl
    export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
    run_step deps cpu "$py" -c "$DEPS_PROBE"
}

# One JSON line: each package of locomesh's tree (its dependencies and `test` extra; selenium, for the
# browser tests, aside) with the version found and whether it meets every pin on it, and each
# top-level module installed from the wheels that fails to import (a compiled one the image's
# libraries cannot load, say). It fails if a package is absent or a module fails; a version that
# misses a pin (the image's torch) is listed, not a failure.
DEPS_PROBE='
import importlib, importlib.metadata as md, json, os, platform, sys
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
import locomesh.training
found, differ, missing, todo, seen = {}, [], [], [("locomesh", ("test",))], set()
while todo:
    name, extras = todo.pop()
    dist = md.distribution(name)
    parent = dist.metadata["Name"]
    for line in dist.requires or []:
        req = Requirement(line)
        if req.marker and not any(req.marker.evaluate({"extra": extra}) for extra in ("", *extras)):
            continue
        key = canonicalize_name(req.name)
        if key == "selenium":
            continue
        try:
            version = md.version(req.name)
        except md.PackageNotFoundError:
            missing.append(f"{req.name} (for {parent})")
            continue
        found[key] = version
        if not req.specifier.contains(version, prereleases=True):
            differ.append(f"{key} {version} (for {parent}: {req.specifier})")
        if (key, tuple(sorted(req.extras))) not in seen:
            seen.add((key, tuple(sorted(req.extras))))
            todo.append((req.name, tuple(sorted(req.extras))))
site, unloadable = os.environ.get("PYTHONPATH", "").split(os.pathsep)[0], []
for top in sorted(md.packages_distributions()):
    if site and top.isidentifier() and top != "locomesh" and (
            os.path.isdir(os.path.join(site, top)) or os.path.isfile(os.path.join(site, top + ".py"))):
        try:
            importlib.import_module(top)
        except Exception as error:
            unloadable.append(f"{top}: {error!r}"[:200])
print(json.dumps({"python": platform.python_version(), "executable": sys.executable,
                  "locomesh": locomesh.training.__path__[0], "packages": len(found), "differ": sorted(set(differ)),
                  "missing": sorted(set(missing)), "unloadable": unloadable, "versions": dict(sorted(found.items()))}))
bad = sorted(set(missing)) + unloadable
sys.exit("missing or failing to import: " + "; ".join(bad) if bad else 0)
'

step_card() {
    if command -v nvidia-smi >/dev/null; then
        run_step nvidia-smi "$device" nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    elif ((dry)); then
        record nvidia-smi skipped "" 0 0 cpu "" "nvidia-smi: not on this machine"
    else
        record nvidia-smi failed "" 0 0 "$device" "" "nvidia-smi: not on this machine"
    fi
    run_step torch "$device" "$py" -c "$TORCH_PROBE" "$mode"
}

# Prints torch's view of the machine as one JSON line; in gpu mode it fails without a CUDA device.
TORCH_PROBE='
import json, platform, sys, torch
import locomesh.training.devices
ok = torch.cuda.is_available()
print(json.dumps({"torch": torch.__version__, "torch_cuda": torch.version.cuda, "cuda_available": ok,
                  "python": platform.python_version(), "executable": sys.executable,
                  "locomesh": locomesh.training.devices.__file__,
                  "devices": torch.cuda.device_count() if ok else 0,
                  "name": torch.cuda.get_device_name(0) if ok else None}))
sys.exit(0 if ok or sys.argv[1] != "gpu" else "torch sees no CUDA device (its build: " + torch.__version__ + ")")
'

step_tests() {
    run_step tests "$device" "$py" -m pytest -q -p no:cacheprovider -rs tests/test_devices.py tests/test_node_config.py \
        "${test_args[@]}"
}

step_throughput() {
    local preset
    for preset in "${presets[@]}"; do
        run_step "throughput-$preset" "$device" "$py" bench/llama_throughput.py --device "$device" --preset "$preset" \
            "${throughput_args[@]}"
    done
}

step_daemons() {
    run_step daemons "$device" "$py" bench/llama_daemons.py --device "$device" --log "$out/logs/daemons-nodes.log" \
        "${daemon_args[@]}"
}

# The preset's shapes as bench/diloco_vs_ddp.py's --llama JSON (its vocabulary stays the corpus's).
preset_shapes() {
    timeout 60 "$py" -c '
import json, sys
from locomesh.training.llama import LLAMA_PRESETS
preset = LLAMA_PRESETS[sys.argv[1]]
keys = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
        "tie_word_embeddings")
print(json.dumps({"preset": sys.argv[1], **{key: getattr(preset, key) for key in keys}}))
' "$1"
}

step_diloco() {
    local shapes
    if ! shapes=$(preset_shapes "$diloco_preset" 2>"$out/logs/diloco-shapes.log"); then
        record diloco failed "" 0 0 cpu logs/diloco-shapes.log "preset_shapes $diloco_preset"
        return 0
    fi
    run_step diloco cpu "$py" bench/diloco_vs_ddp.py --task llama --llama "$shapes" "${diloco_args[@]}"
}

# Writes gpu_check.json and gpu_check.md from steps.tsv and the logs, then exits: 0 if every
# step passed (or was skipped: nvidia-smi on a dry run), else 1 (or the given status).
finish() {
    local status=${1:-}
    trap - INT TERM
    local summary_py=python3
    command -v python3 >/dev/null || summary_py=$py
    "$summary_py" - "$out" "$mode" "$SECONDS" <<<"$SUMMARY" || status=1
    echo "gpu_check: $out/gpu_check.md" >&2
    if [[ -z $status ]]; then
        status=0
        awk -F'\t' '$2 != "passed" && $2 != "skipped" {bad = 1} END {exit !bad}' "$out/steps.tsv" && status=1
    fi
    exit "$status"
}

SUMMARY=$(cat <<'PY'
import json, re, sys
from pathlib import Path

out, mode, seconds = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
FIELDS = ("name", "status", "rc", "seconds", "limit_s", "device", "log", "command")


def last_json(log):
    """The last line of a log that is a JSON object (what a bench or the probe printed)."""
    if not log or not (out / log).is_file():
        return None
    for line in reversed((out / log).read_text(errors="replace").splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                pass
    return None


def cpu_model():
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return "unknown CPU"


def smi(log):
    """nvidia-smi csv: one dict a GPU."""
    path = out / log if log else None
    if not path or not path.is_file():
        return []
    lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    if len(lines) < 2 or "," not in lines[0]:
        return []
    heads = [head.strip() for head in lines[0].split(",")]
    return [dict(zip(heads, (cell.strip() for cell in line.split(",")))) for line in lines[1:]]


def pytest_counts(log):
    text = (out / log).read_text(errors="replace") if log and (out / log).is_file() else ""
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|deselected|errors?|xfailed|xpassed)",
                                                     text.strip().splitlines()[-1] if text.strip() else "")}
    counts["skip_reasons"] = re.findall(r"^SKIPPED .*$", text, re.M)
    return counts


def result_of(step):
    if step["name"] == "nvidia-smi":
        return smi(step["log"])
    if step["name"] == "tests":
        return pytest_counts(step["log"])
    return last_json(step["log"])


def last_line(log):
    path = out / log if log else None
    lines = path.read_text(errors="replace").splitlines() if path and path.is_file() else []
    return next((line.strip()[:200] for line in reversed(lines) if line.strip()), "")


def brief(step):
    """The step figure for the markdown table; for a step that did not pass, its log's last line."""
    result = step["result"]
    if step["status"] not in ("passed", "skipped") and step["name"] != "tests":
        return last_line(step["log"])
    if step["name"] == "wheels":
        return last_line(step["log"])
    if not result:
        return ""
    if step["name"] == "tests":
        return ", ".join(f"{n} {word}" for word, n in result.items() if word != "skip_reasons")
    if step["name"] == "nvidia-smi":
        return "; ".join(", ".join(gpu.values()) for gpu in result)
    if step["name"] == "torch":
        return (f"torch {result['torch']}, CUDA {result['torch_cuda']}, devices {result['devices']}; "
                f"Python {result.get('python')}, locomesh from {result.get('locomesh')}")
    if step["name"] == "deps":
        return (f"{result['packages']} packages; pins missed: {', '.join(result['differ']) or 'none'}"
                + (f"; missing: {', '.join(result['missing'])}" if result["missing"] else "")
                + (f"; failing to import: {', '.join(result.get('unloadable', []))}" if result.get("unloadable") else ""))
    if step["name"].startswith("throughput-"):
        return "; ".join(f"{row['tokens_per_s']:.0f} tokens/s" + (f", MFU {row['mfu']:.3f}" if "mfu" in row else "")
                         + f" (batch {row['batch']} x {row['context']})" for row in result["rows"])
    if step["name"] == "daemons":
        meta = result["meta"]
        return (f"same state hash: {meta['same_state_hash']}; eval {meta['eval_loss_first_to_last']}; "
                f"exit codes {meta['daemon_exit_codes']}; {meta['seconds']['total']} s")
    if step["name"] == "diloco":
        tokens = result["meta"].get("data", {}).get("tokens_per_method")
        return f"{tokens} tokens a method; " + "; ".join(
            f"{row['method']} {row['eval_loss']:.4f} ({row['loss_vs_ddp']:.3f}x DDP, {row['bytes_reduction']:.0f}x fewer bytes)"
            for row in result["rows"])
    return ""


def torch_pin():
    """pyproject.toml's pin on torch (`==2.13.0`), or None."""
    try:
        text = Path("pyproject.toml").read_text()
    except OSError:
        return None
    match = re.search(r'"torch\s*([<>=!~][^";]*)', text)
    return match.group(1).strip() if match else None


def cards(steps):
    by_name = {step["name"]: step for step in steps}
    probe = (by_name.get("torch") or {}).get("result") or {}
    gpus = (by_name.get("nvidia-smi") or {}).get("result") or []
    gpu = probe.get("name") or (gpus[0].get("name") if gpus else None) or "no GPU seen"
    return {"gpu": gpu, "cpu": cpu_model(), "nvidia_smi": gpus, "torch": probe}


def table(columns, rows):
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(cell).replace("|", "\\|") for cell in row) + " |" for row in rows]
    return lines


def bench_tables(steps, card_of):
    lines = []
    for step in steps:
        result = step["result"]
        if not isinstance(result, dict) or "rows" not in result or not result["rows"]:
            continue
        columns = list(dict.fromkeys(key for row in result["rows"] for key in row if key != "card"))
        lines += ["", f"### {step['name']} on {card_of(step)}", ""]
        lines += table(["card", *columns], [[row.get("card", card_of(step)), *(cell(row.get(key, "")) for key in columns)]
                                            for row in result["rows"]])
    return lines


def cell(value):
    return f"{value:.4g}" if isinstance(value, float) else value


def main():
    steps = [dict(zip(FIELDS, line.split("\t"))) for line in (out / "steps.tsv").read_text().splitlines() if line]
    for step in steps:
        step["result"] = result_of(step)
    card = cards(steps)

    def card_of(step):
        return card["cpu"] if step["device"] == "cpu" else card["gpu"]

    for step in steps:
        step["card"] = card_of(step)
    ok = all(step["status"] in ("passed", "skipped") for step in steps)
    report = {"mode": mode, "passed": ok, "seconds": seconds, "card": card, "steps": steps}
    title = card["gpu"] if mode == "gpu" else card["cpu"]
    torch_version, pin = card["torch"].get("torch"), torch_pin()
    report["torch_pin"] = pin  # pyproject's; card.torch.torch is the one measured
    if torch_version and pin and pin.startswith("==") and torch_version.split("+")[0] != pin[2:]:
        torch_note = f", not pyproject's torch{pin}: the figures are {torch_version}'s"
    else:
        torch_note = ""
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    lines = [f"# gpu_check ({mode}) on {title}", "",
             f"{'all steps passed' if ok else 'NOT all steps passed'} in {seconds} s; "
             f"torch {torch_version} (CUDA build {card['torch'].get('torch_cuda')}){torch_note}; "
             f"Python {card['torch'].get('python')}.", ""]
    lines += table(["step", "status", "seconds", "limit s", "card", "figure", "log"],
                   [[s["name"], s["status"], s["seconds"], s["limit_s"], s["card"], brief(s), s["log"] or s["command"]]
                    for s in steps])
    lines += bench_tables(steps, card_of)
    (out / "gpu_check.md").write_text("\n".join(lines) + "\n")


main()
PY
)

main() {
    parse_args "$@"
    configure
    mkdir -p "$out/logs"
    out=$(cd "$out" && pwd)
    cd "$top"
    : >"$out/steps.tsv"
    interrupted=
    deadline=$((SECONDS + BUDGET_S))
    echo "gpu_check: $mode, results under $out, budget ${BUDGET_S} s" >&2
    ensure_python
    step_wheels
    step_card
    step_tests
    step_throughput
    step_daemons
    step_diloco
    finish
}

main "$@"
