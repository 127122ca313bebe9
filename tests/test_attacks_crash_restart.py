"""Issue #18, finding A: a crash after committing got the volunteer banned for good, silently.

CRDT ops were held in memory only, so a node killed after its commit and restarted signed new ops
at places of its chain it had used already: a fork, which the run bans. Now every op a node
applies is kept in the run's op log on disk, its own synced before they are published
(node/replication/op_log.py); a restart loads it first, the round's payload committed before the crash is
contributed again (a second, different commitment would be an equivocation too); and a ban of
the node's own key is logged, shown by `run status`, and refuses `run join` with an exit code.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import trio

from locomesh.cli.client import RpcCallError
from locomesh.cli.daemon_process import DaemonProcess
from locomesh.cli.swarm_cmd import create_run, join, join_all, start_swarm, wait_connected
from locomesh.crdt import Replica, encode_op, op_id
from locomesh.node.replication.service import CrdtService
from locomesh.node.rounds import machine as rm
from locomesh.netsim.offload import run_inline
from locomesh.netsim.sim_participant import SimCost, SimParticipant
from locomesh.node.datadir import IDENTITY_FILE, load_identity
from locomesh.node.replication.op_log import OpLog, load_into
from locomesh.node.rounds.participation import RunParticipation
from locomesh.node.runtime import Node
from locomesh.protocol.runs import load_manifest, parse_run_id, sign_manifest
from locomesh.training.participant import payload_limits

from .test_crdt_support import H1, H2, content_of, genesis, keys
from .test_node_crdt_sync import LOOPBACK

ROUND_DEADLINE = 60.0


def records(path) -> list[bytes]:
    """The ops in an op log file, read as a second process would (no truncation, no locks)."""
    data, found, offset = path.read_bytes(), [], 0
    while offset + 4 <= len(data):
        length = int.from_bytes(data[offset:offset + 4], "big")
        if offset + 4 + length > len(data):
            break
        found.append(data[offset + 4:offset + 4 + length])
        offset += 4 + length
    return found


async def run_crdt_node(identity, data_dir, manifest, work) -> None:
    """Start a node with a CrdtService on `data_dir`, open the run, call `await work(service,
    replica)`, and stop the node (its op logs closed) before returning."""
    service = CrdtService(data_dir, sync_interval=3600)
    node = Node.create(identity, listen_addrs=LOOPBACK, services=[service])
    async with trio.open_nursery() as nursery:
        await nursery.start(node.run)
        replica = await service.open_run(manifest)
        await work(service, replica)
        node.request_stop()


# --- the node keeps its ops ----------------------------------------------------------------------------


async def test_a_node_restarted_on_its_data_dir_signs_after_its_own_newest_op(tmp_path, identity_factory):
    me = identity_factory(1)
    manifest = sign_manifest(me, task="synthetic", created=1)
    log_path = OpLog.for_run(tmp_path, load_manifest(manifest)[0]).path
    written = []

    async def before_the_crash(service, replica):
        written.append(service.write(replica.run_id, "join", round=1))
        written.append(service.write(replica.run_id, "commit", round=1, hash=H1, size=10))
        assert records(log_path) == written  # on disk before the gossip flush could publish them

    async def after_the_restart(service, replica):
        assert replica.op_ids() == {op_id(data) for data in written}
        vote = service.write(replica.run_id, "prevote", round=1, epoch=0, attempt=0, value=H2)
        assert content_of(vote)["body"]["seq"] == 3
        assert not replica.state.banned and service.ban_reason(replica.run_id) is None

    await run_crdt_node(me, tmp_path, manifest, before_the_crash)
    await run_crdt_node(me, tmp_path, manifest, after_the_restart)


async def test_after_a_restart_a_node_never_contradicts_nor_repeats_what_it_said(tmp_path, identity_factory):
    me = identity_factory(1)
    manifest = sign_manifest(me, task="synthetic", created=1)

    async def before_the_crash(service, replica):
        service.write(replica.run_id, "join", round=1)
        service.write(replica.run_id, "precommit", round=1, epoch=0, attempt=0, value=H1, state=H1)
        service.write(replica.run_id, "checkpoint", round=1, id=H1, size=10)

    async def after_the_restart(service, replica):
        held = len(replica)
        precommit = {"round": 1, "epoch": 0, "attempt": 0}
        assert service.write(replica.run_id, "precommit", **precommit, value=H2, state=H2) is None  # a double vote: a ban
        assert service.write(replica.run_id, "precommit", **precommit, value=H1, state=H1) is None  # said already
        assert service.write(replica.run_id, "checkpoint", round=1, id=H1, size=10) is None
        assert len(replica) == held and not replica.state.banned

    await run_crdt_node(me, tmp_path, manifest, before_the_crash)
    await run_crdt_node(me, tmp_path, manifest, after_the_restart)


async def test_a_torn_or_damaged_op_log_loads_what_is_whole(tmp_path):
    me = keys(1)[0]
    source = Replica(genesis(me))
    ops = [source.create(me, "join", round=1), source.create(me, "commit", round=1, hash=H1, size=10),
           source.create(me, "prevote", round=1, epoch=0, attempt=0, value=H1)]
    damaged = bytearray(ops[1])
    damaged[-10] ^= 1  # inside the seal's signature
    path = tmp_path / "run.ops"
    path.write_bytes(b"".join(len(d).to_bytes(4, "big") + d for d in (ops[0], bytes(damaged), ops[2]))
                     + len(ops[0]).to_bytes(4, "big") + ops[0][:7])  # a write cut short by a crash
    replica = Replica(source.genesis)
    log = await load_into(replica, OpLog(path))
    assert replica.op_ids() == {op_id(ops[0])} and len(replica.pending) == 1  # the prevote waits for its parent
    replica.add(ops[1])  # anti-entropy brings the good copy: both apply, and are kept
    log.close()
    again = Replica(source.genesis)
    await load_into(again, OpLog(path))
    assert again.op_ids() == {op_id(data) for data in ops}


async def test_a_round_committed_before_a_restart_contributes_the_payload_committed_then(tmp_path):
    """A second, different commitment for the round would be an equivocation: the participation
    takes the payload it committed to from its store instead of training a new one."""
    me = keys(1)[0]
    replica = Replica(genesis(me))
    replica.create(me, "join", round=1)
    participant = SimpleNamespace(settings=SimpleNamespace(delayed_updates=False),
                                  payload_limits=lambda run, round_, size: payload_limits(run, round_, size, 1 << 20))
    party = RunParticipation(SimpleNamespace(identity=me), None, replica, participant, tmp_path, scores=None,
                             timing=rm.Timing(), offload=run_inline)
    payload = bytes(range(256)) * 40
    stored_id, _size = await party.exchange.allgather.store(1, payload)
    assert await party.exchange.allgather.committed_before(1) is None  # nothing committed: train as usual
    replica.create(me, "commit", round=1, hash=stored_id, size=len(payload))
    assert (await party.exchange.allgather.committed_before(1)).payload == payload
    replica.create(me, "commit", round=2, hash=H2, size=len(payload))  # lost with the disk: nothing to reuse
    assert await party.exchange.allgather.committed_before(2) is None



async def test_a_sharded_round_committed_before_a_restart_contributes_the_same_framed_payload(tmp_path):
    """Sharded exchange keeps our framed payload as one file: after a restart the commitment (the
    Merkle root over its shards) is honoured with the same bytes, and a file that is not what we
    committed to (lost, or another payload) is not used."""
    me = keys(1)[0]
    replica = Replica(genesis(me))
    replica.create(me, "join", round=1)
    participant = SimParticipant({"hparams": {"inner_steps": 1}, "seed": 1}, me.public_key, SimCost(payload_bytes=4096))
    node = SimpleNamespace(identity=me)
    party = RunParticipation(node, None, replica, participant, tmp_path, scores=None, timing=rm.Timing(),
                             offload=run_inline)
    sharded = party.exchange.sharded
    payload = participant.train(None, None, None, True).payload
    root, size = await sharded.store(1, payload)
    assert await sharded.committed_before(1) is None  # nothing committed: train as usual
    replica.create(me, "commit", round=1, hash=root, size=size)
    restarted = RunParticipation(node, None, replica, participant, tmp_path, scores=None, timing=rm.Timing(),
                                 offload=run_inline)
    assert (await restarted.exchange.sharded.committed_before(1)).payload == payload
    other = participant.train(None, None, None, True).payload
    other_root, _ = await sharded.store(2, other)
    replica.create(me, "commit", round=2, hash=H2, size=len(other))  # not the root of the stored file
    assert await restarted.exchange.sharded.committed_before(2) is None and other_root != H2

# --- a ban is visible ----------------------------------------------------------------------------------


def test_a_banned_key_is_shown_banned_and_cannot_join_again(tmp_path):
    log = open(tmp_path / "daemons.log", "wb")
    daemons = start_swarm(tmp_path, 2, log=log)
    victim = daemons[1]
    try:
        wait_connected(daemons)
        run_id = create_run(daemons[0], {"inner_steps": 2, "round_deadline_s": ROUND_DEADLINE, "min_peers": 3},
                            admitted=daemons)
        join(victim, run_id)
        victim.stop()
        # The disk shows that this key signed two different ops at seq 1: a fork.
        me = load_identity(victim.data_dir / IDENTITY_FILE)
        path = OpLog.for_run(victim.data_dir, parse_run_id(run_id)).path
        fork = encode_op(me, parse_run_id(run_id), "crdt.join", [], 1, round=2)
        assert fork not in records(path)
        with open(path, "ab") as file:
            file.write(len(fork).to_bytes(4, "big") + fork)
        bootstrap = daemons[0].rpc().call("node.status")["listen_addrs"][:1]
        victim = DaemonProcess(victim.data_dir, bootstrap=bootstrap, log=log).start()
        victim.wait_ready()
        status = _wait_status(victim, run_id, lambda s: s["phase"] == "banned", 60)
        assert status["banned"] and "fork" in status["ban_reason"]
        joined = subprocess.run([sys.executable, "-m", "locomesh.cli.main", "run", "join", run_id, "--data-dir",
                                 str(victim.data_dir)], capture_output=True, text=True, timeout=90)
        assert joined.returncode != 0 and "banned" in joined.stderr, (joined.returncode, joined.stdout, joined.stderr)
    finally:
        for daemon in [*daemons, victim]:
            daemon.stop()
        log.close()
    warnings = [line for line in (tmp_path / "daemons.log").read_text().splitlines() if "WARNING" in line]
    assert any("key is banned" in line and "fork" in line for line in warnings), warnings


# --- the finding, between real daemons -------------------------------------------------------------


def test_a_volunteer_killed_after_its_commit_restarts_unbanned_and_trains_on(tmp_path):
    """Four daemons; one is killed with SIGKILL just after its commit and started again on its data
    dir before its network is back (its bootstrap peer is reached through a forwarder that only
    opens once the run is taken up), so all it knows of its own chain then is what its disk kept.
    It must not be banned, and must train on: its prevotes and precommits of the round were on its
    disk, so it says nothing that contradicts them."""
    log = open(tmp_path / "daemons.log", "wb")
    daemons = start_swarm(tmp_path, 4, log=log)
    victim = daemons[3]
    restarted = None
    first = daemons[0].rpc().call("node.status")
    network = Forwarder(int(first["listen_addrs"][0].split("/tcp/")[1].split("/")[0]))
    try:
        wait_connected(daemons)
        run_id = create_run(daemons[0], {"inner_steps": 4, "round_deadline_s": ROUND_DEADLINE, "min_peers": 4},
                            admitted=daemons)
        join_all(daemons, run_id)
        status = _wait_status(victim, run_id, lambda s: s["round"] >= 1 and s["phase"] == "committed", 180)
        killed_in = status["round"] + 1
        victim.process.send_signal(signal.SIGKILL)
        victim.wait()
        bootstrap = [f"/ip4/127.0.0.1/tcp/{network.port}/p2p/{first['peer_id']}"]
        restarted = DaemonProcess(victim.data_dir, bootstrap=bootstrap, log=log,
                                  env={**os.environ, "OMP_NUM_THREADS": "1"}).start()  # as start_swarm does
        restarted.wait_ready()
        _wait_status(restarted, run_id, lambda s: True, 60)  # the run is taken up again, alone
        network.open()
        alive = [*daemons[:3], restarted]
        final = _wait_all(alive, run_id, lambda s: _trained_after(s[3], killed_in) and min(x["certified"] for x in s)
                          >= killed_in + 2, 120)
    finally:
        for daemon in [*daemons, *([restarted] if restarted else [])]:
            if daemon.process is not None and daemon.process.poll() is None:
                daemon.stop()
        network.close()
        log.close()
    assert not any(s.get("banned") for s in final), [s.get("ban_reason") for s in final]
    assert all(s["members"] == 4 for s in final)


def test_a_member_killed_before_its_commit_does_not_stall_a_three_member_run(tmp_path):
    """Finding B: three daemons, one killed with SIGKILL for good while it trains a round. More than
    two thirds of three is all three: on bfb477a the other two sat in that round until the killed
    one came back. Now, `recover_after` attempt deadlines later, both sign a recover, the round is
    decided by the two of them (a recovery epoch), and rounds go on without the dead member;
    `run status` said meanwhile whom the round waited for."""
    log = open(tmp_path / "daemons.log", "wb")
    daemons = start_swarm(tmp_path, 3, log=log)
    try:
        wait_connected(daemons)
        run_id = create_run(daemons[0], {"inner_steps": 40, "round_deadline_s": 15, "min_peers": 3}, admitted=daemons)
        join_all(daemons, run_id)
        victim = daemons[2]
        victim_peer = victim.rpc().call("node.status")["peer_id"]
        status = _wait_status(victim, run_id, lambda s: s["certified"] >= 2 and s["phase"] == "train", 180)
        stalled = status["certified"] + 1
        victim.process.send_signal(signal.SIGKILL)
        victim.wait()
        waiting = _wait_status(daemons[0], run_id, lambda s: s["waiting"].get("step") in ("prevote", "precommit")
                               and len(s["waiting"]["on"]) == 1, 60)["waiting"]  # once the other live one's are in
        final = _wait_all(daemons[:2], run_id, lambda s: min(x["round"] for x in s) >= stalled + 1, 150)
    finally:
        for daemon in daemons:
            if daemon.process is not None and daemon.process.poll() is None:
                daemon.stop()
        log.close()
    assert waiting["on"] == [victim_peer], waiting
    assert final[0]["state_hash"] == final[1]["state_hash"]
    assert final[0]["epoch"] >= 1  # decided by a recovery
    assert final[0]["members"] == 3  # the dead member keeps its place on the roster: back by committing


class Forwarder:
    """A TCP forwarder on loopback to `target_port` whose port refuses connections until `open()`."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))  # bound, not listening: a connection is refused
        self.port = self.server.getsockname()[1]
        self.sockets: list[socket.socket] = [self.server]

    def open(self) -> None:
        self.server.listen()
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()

    def _accept(self) -> None:
        while True:
            try:
                inbound, _address = self.server.accept()
                outbound = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                return
            outbound.settimeout(None)
            self.sockets += [inbound, outbound]
            for source, sink in ((inbound, outbound), (outbound, inbound)):
                threading.Thread(target=_pump, args=(source, sink), daemon=True).start()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def _trained_after(status: dict, round_number: int) -> bool:
    """Did this node train (not only sync) a round after `round_number`?"""
    return any(record["round"] > round_number and not record["synced"] for record in status["history"])


def _status(daemon, run_id: str) -> dict | None:
    try:
        return daemon.rpc().call("run.status", {"run_id": run_id})
    except RpcCallError:  # not joined yet: a run is taken up again in the background after a start
        return None


def _wait_status(daemon, run_id: str, predicate, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    status = None
    while time.monotonic() < deadline:
        status = _status(daemon, run_id)
        if status is not None and predicate(status):
            return status
        time.sleep(0.1)
    raise AssertionError(f"timed out; last status: {status}")


def _wait_all(daemons, run_id: str, predicate, timeout: float) -> list[dict]:
    deadline = time.monotonic() + timeout
    statuses = None
    while time.monotonic() < deadline:
        statuses = [_status(daemon, run_id) for daemon in daemons]
        if None not in statuses and predicate(statuses):
            return statuses
        time.sleep(0.2)
    progress = [s and (s["phase"], s["round"], s["certified"], s.get("ban_reason")) for s in statuses or []]
    raise AssertionError(f"timed out: {progress}")
