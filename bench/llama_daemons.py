"""Real daemons train the `llama` task on real text: N processes on loopback, R rounds, loss per round.

The corpus is this Python's standard library sources, BPE-tokenized and packed
(bench/_corpus.py: vocabulary 2048, shards of 4096 tokens, 2% held out), packed into node 0's
checkpoint store before the daemons start: node 0 holds the dataset and the others fetch the
index, the tokenizer, the held-out shards and, round by round, the train shards each round
assigns them, from whoever holds them (every chunk verified). Node 0 creates a public run of
the llama task on it (`--model`: hidden 128, 2 layers, MLP 384, context 64, tied embeddings;
656k parameters), every node joins it (`cli/swarm_cmd.py`: one torch thread per daemon), and
the swarm trains `--rounds` rounds of `--inner-steps` inner steps.

Per round, from each daemon's `run.status`: its eval loss on the held-out shards (nats per token;
the daemons evaluate the same certified state on the same windows, so the figures agree:
`eval_spread` is max − min over nodes), the train loss (the mean over the inner steps; of the
nodes that aggregated the round themselves: `synced` counts those the certificate overtook, who
replayed its payloads or took its state, and record no train loss), the round's seconds (from the start of a node's
training to the round's certificate, the max over nodes; `train_s` the inner steps of it,
`exchange_s` from the last commit seen to the new state: payload fetches and the outer step),
the contributors the certificate counts, and the shards each node trained on (how many, then the
first 6 hex digits of each ID; `disjoint`: no shard trained by two nodes in the round). The
summary (meta) says whether the eval loss fell every round (from the state before round 1 on),
gives the first and last figures, and whether all nodes hold the same state hash; the script
exits 1 if the loss did not fall every round, the hashes differ or a daemon did not exit 0.

    .venv/bin/python bench/llama_daemons.py                 # 3 daemons, 6 rounds (1-2 minutes)
    .venv/bin/python bench/llama_daemons.py --nodes 4 --rounds 10 --inner-steps 50
    .venv/bin/python bench/llama_daemons.py --nodes 2 --device cuda:0   # both daemons on one GPU
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _corpus import stdlib_corpus
from _report import machine, report

from locomesh.cli.swarm_cmd import common_round, hashes_at, join_all, start_swarm, stop_swarm, train, wait_connected
from locomesh.node.datadir import CHECKPOINT_DIR

MODEL = {"hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "tie_word_embeddings": True}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=3, help="daemons (default 3)")
    parser.add_argument("--rounds", type=int, default=6, help="rounds to train (default 6)")
    parser.add_argument("--inner-steps", type=int, default=30, help="H (default 30)")
    parser.add_argument("--batch", type=int, default=8, help="windows per inner step (default 8)")
    parser.add_argument("--inner-lr", type=float, default=3e-3)
    parser.add_argument("--context", type=int, default=64, help="tokens per window (default 64)")
    parser.add_argument("--eval-sequences", type=int, default=256, help="held-out windows each eval reads")
    parser.add_argument("--model", default="{}", help="JSON of llama fields (Hugging Face names) over MODEL's")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=JSON",
                        help="another run setting (codec, aggregator, outer_lr, ...), repeatable")
    parser.add_argument("--deadline", type=float, default=120.0, help="round deadline in seconds")
    parser.add_argument("--seed", type=int, default=7, help="the run's seed")
    parser.add_argument("--vocab", type=int, default=2048, help="the BPE tokenizer's vocabulary")
    parser.add_argument("--shard-tokens", type=int, default=4096)
    parser.add_argument("--log", default=None, help="write the daemons' logs to this file")
    parser.add_argument("--device", default=None, metavar="SPEC",
                        help="every daemon's `node start --device` (cpu, cuda:0, ...; default: the node's own, auto)")
    return parser.parse_args()


def settings_of(args: argparse.Namespace, dataset_hex: str, vocab_size: int) -> dict:
    settings = {
        **MODEL, **json.loads(args.model), "vocab_size": vocab_size, "max_position_embeddings": args.context,
        "sequence_length": args.context, "dataset": dataset_hex, "eval_sequences": args.eval_sequences,
        "inner_steps": args.inner_steps, "batch_size": args.batch, "inner_lr": args.inner_lr,
        "min_peers": args.nodes, "round_deadline_s": args.deadline,
    }
    for item in args.set:
        key, _, value = item.partition("=")
        settings[key] = json.loads(value)
    return settings


def record(status: dict, round_number: int) -> dict | None:
    return next((entry for entry in status["history"] if entry["round"] == round_number), None)


def round_row(round_number: int, statuses: list[dict]) -> dict:
    """The row of round `round_number`, from every node's `run.status`."""
    records = [record(status, round_number) for status in statuses]
    evals = [None if entry is None else entry["eval_loss"] for entry in records]
    known = [loss for loss in evals if loss is not None]
    row: dict = {"round": round_number}
    for index, loss in enumerate(evals):
        row[f"eval_node{index}"] = loss
    row["eval_spread"] = max(known) - min(known) if known else None
    trains = [entry["train_loss"] for entry in records if entry is not None and entry["train_loss"] is not None]
    row["train_loss"] = sum(trains) / len(trains) if trains else None
    row["seconds"] = max((entry["seconds"] for entry in records if entry is not None), default=None)
    for key, column in (("train_seconds", "train_s"), ("exchange_seconds", "exchange_s")):
        row[column] = max((entry[key] for entry in records if entry is not None and entry[key] is not None), default=None)
    row["contributors"] = max((entry["contributors"] for entry in records if entry is not None), default=None)
    row["synced"] = sum(1 for entry in records if entry is not None and entry["synced"])
    used = [((status.get("data") or {}).get("rounds") or {}).get(str(round_number)) for status in statuses]
    for index, shards in enumerate(used):
        row[f"shards_node{index}"] = "-" if shards is None else f"{len(shards)}: " + " ".join(s[:6] for s in shards)
    trained = [set(shards) for shards in used if shards]
    row["disjoint"] = "yes" if sum(map(len, trained)) == len(set().union(*trained)) else "no"
    return row


def state_eval(row: dict) -> float | None:
    """The eval loss of the round's state (the same on every node that has it)."""
    return next((value for key, value in row.items() if key.startswith("eval_node") and value is not None), None)


def main() -> None:
    args = parse_args()
    started = time.perf_counter()
    corpus = stdlib_corpus(vocab_size=args.vocab, shard_tokens=args.shard_tokens)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="locomesh-llama-") as scratch:
        root = Path(scratch)
        packed = corpus.pack_into(root / "node0" / CHECKPOINT_DIR)  # node 0 holds the dataset from the start
        pack_seconds = time.perf_counter() - started
        log = open(args.log, "wb") if args.log else subprocess.DEVNULL
        device_args = {index: ["--device", args.device] for index in range(args.nodes)} if args.device else None
        daemons = start_swarm(root, args.nodes, log=log, extra_args=device_args)
        try:
            wait_connected(daemons)
            up_seconds = time.perf_counter() - started
            settings = settings_of(args, packed.id.hex(), corpus.index.vocab_size)
            team = [daemon.rpc().call("node.status")["peer_id"] for daemon in daemons[1:]]
            params = {"task": "llama", "settings": settings, "public": True, "name": "llama-stdlib", "seed": args.seed,
                      "admitted": team}
            run_id = daemons[0].rpc(timeout=60.0).call("run.create", params)["run_id"]
            create_seconds = time.perf_counter() - started - up_seconds
            join_all(daemons, run_id)
            trained_from = time.perf_counter()
            join_seconds = trained_from - started - up_seconds - create_seconds

            def show(round_number: int, statuses: list[dict]) -> None:
                rows.append(round_row(round_number, statuses))
                line = rows[-1]
                evals = " ".join("-" if line[f"eval_node{i}"] is None else f"{line[f'eval_node{i}']:.4f}"
                                 for i in range(args.nodes))
                shards = [line[f"shards_node{i}"].split(":")[0] for i in range(args.nodes)]
                print(f"round {round_number}: eval {evals}  train {line['train_loss'] or float('nan'):.4f}  "
                      f"{line['seconds'] or 0:.1f} s  shards {shards}",
                      file=sys.stderr, flush=True)

            statuses = train(daemons, run_id, args.rounds, timeout=args.rounds * args.deadline + 120, report=show)
            train_seconds = time.perf_counter() - trained_from
        finally:
            stopping = time.perf_counter()
            codes = stop_swarm(daemons)
            stop_seconds = time.perf_counter() - stopping
            if args.log:
                log.close()
    initial = statuses[0]["initial_eval_loss"]
    curve = [initial] + [state_eval(row) for row in rows]
    falls = all(later is not None and earlier is not None and later < earlier for earlier, later in zip(curve, curve[1:]))
    same = len(hashes_at(statuses, common_round(statuses, args.rounds))) == 1
    meta = {
        **machine(),
        "nodes": args.nodes,
        "device": args.device or "auto",
        "rounds": args.rounds,
        "run_settings": {key: value for key, value in settings.items() if key != "dataset"},
        "dataset": packed.id.hex(),
        "params": statuses[0]["params"],
        "corpus": corpus.facts,
        "shards_per_member": (statuses[0].get("data") or {}).get("shards_per_member"),
        "eval_loss_unit": "nats/token on the held-out shards",
        "initial_eval_loss": initial,
        "eval_loss_first_to_last": " -> ".join(
            f"{loss:.4f} ({label})" if loss is not None else f"- ({label})"
            for loss, label in ((initial, "before round 1"), (curve[1], "round 1"),
                                (curve[-1], f"round {rows[-1]['round']}"))),
        "falls_each_round": "yes" if falls else "no",
        "max_eval_spread": max((row["eval_spread"] or 0.0) for row in rows),
        "same_state_hash": same,
        "daemon_exit_codes": codes,
        "seconds": {"corpus_and_pack": round(pack_seconds, 1), "to_connected": round(up_seconds, 1),
                    "create": round(create_seconds, 1), "join_all": round(join_seconds, 1),
                    "training": round(train_seconds, 1),
                    "stop": round(stop_seconds, 1), "total": round(time.perf_counter() - started, 1)},
        "cpu": "2 cores shared with other jobs; one torch thread per daemon (OMP_NUM_THREADS=1, start_swarm)",
    }
    report("llama_daemons", rows, meta)
    if not falls or not same or any(codes):
        sys.exit(1)


if __name__ == "__main__":
    main()
