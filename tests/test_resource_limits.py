"""Resource limits (#24, item 3): rate caps, training threads, and when a node trains.

The token bucket runs under trio's MockClock (exact virtual times); the caps are then measured on
loopback between real daemons (an upper bound only: a slow machine makes a transfer slower, never
faster). The schedule is a pure decision whose platform probes are injected.
"""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest
import torch
import trio
import trio.testing

from locomesh.cli.daemon_process import DaemonProcess
from locomesh.node.bandwidth import SLICE, Bandwidth, TokenBucket
from locomesh.node.config import ConfigError, load_config, parse_rate
from locomesh.node.meter import PacedStream
from locomesh.node.schedule import ScheduleError, TrainingSchedule, parse_window
from locomesh.node.transfer.dataplane import SealedStream
from locomesh.node.transfer.store import write_checkpoint

from .test_checkpoint_transfer_dataplane import key_pair_sessions

MB = 1_000_000


# --- the token bucket, in virtual time ---------------------------------------------------------


async def test_a_bucket_lets_bytes_through_at_its_rate_after_one_burst(autojump_clock):
    bucket = TokenBucket(1000, burst=100)
    start = trio.current_time()
    for _ in range(20):
        await bucket.take(100)
    # 2000 bytes at 1000 B/s, the first burst's worth free: 1.9 s exactly.
    assert trio.current_time() - start == pytest.approx(1.9)
    assert bucket.total == 2000


async def test_an_uncapped_bucket_never_waits_and_still_counts(autojump_clock):
    bucket = TokenBucket()
    start = trio.current_time()
    await bucket.take(10 * MB)
    bucket.charge(5 * MB)
    assert trio.current_time() == start and bucket.total == 15 * MB
    assert bucket.current_rate() == 3 * MB  # 15 MB over the 5 s window


async def test_concurrent_senders_share_the_cap_in_the_order_they_asked(autojump_clock):
    bucket = TokenBucket(1000, burst=100)
    finished: list[tuple[str, float]] = []

    async def send(name: str, pieces: int) -> None:
        for _ in range(pieces):
            await bucket.take(100)
        finished.append((name, trio.current_time()))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(send, "a", 10)
        nursery.start_soon(send, "b", 10)
    # Together 2000 bytes: the cap is the total, not each sender's.
    assert max(at for _, at in finished) == pytest.approx(1.9)


async def test_a_cancelled_reservation_is_given_back(autojump_clock):
    bucket = TokenBucket(1000, burst=100)
    await bucket.take(100)
    with trio.move_on_after(0.1):
        await bucket.take(1000)  # would wait 1 s
    start = trio.current_time()
    await bucket.take(100)
    assert trio.current_time() - start == pytest.approx(0.0, abs=1e-9)


async def test_a_reader_waits_for_what_it_was_charged(autojump_clock):
    bucket = TokenBucket(1000, burst=100)
    start = trio.current_time()
    bucket.charge(600)  # a read got 600 bytes
    await bucket.wait_ready()
    assert trio.current_time() - start == pytest.approx(0.5)


class _Recorder:
    """A byte stream that records what was written to it, when."""

    def __init__(self) -> None:
        self.writes: list[tuple[float, int]] = []
        self.incoming = b""

    async def write(self, data: bytes) -> None:
        self.writes.append((trio.current_time(), len(data)))
        await trio.sleep(0)  # where a cancel that came meanwhile lands

    async def read(self, n: int | None = None) -> bytes:
        data, self.incoming = self.incoming[:n], self.incoming[n:]
        return data

    async def close(self) -> None:
        pass


async def test_a_paced_libp2p_write_is_not_given_up_when_its_writer_is_cancelled(autojump_clock):
    """Noise sealed it with its next nonce already: dropped, it would tear the session (whole_writes.py)."""
    bandwidth = Bandwidth()
    bandwidth.upload.set_rate(1000)
    recorder = _Recorder()
    paced = PacedStream(recorder, bandwidth)
    await paced.write(b"x" * 65_537)  # the bucket is behind now
    with trio.move_on_after(0.01) as scope:
        await paced.write(b"y" * 1000)
    assert scope.cancelled_caught
    assert [size for _, size in recorder.writes] == [65_537, 1000]  # written whole, then the cancel landed


async def test_paced_libp2p_reads_take_at_most_a_slice_and_wait_for_the_cap(autojump_clock):
    bandwidth = Bandwidth()
    bandwidth.download.set_rate(100_000)
    recorder = _Recorder()
    recorder.incoming = bytes(1_000_000)
    paced = PacedStream(recorder, bandwidth)
    start, got = trio.current_time(), 0
    while got < 1_000_000:
        chunk = await paced.read(1_000_000)
        assert len(chunk) <= SLICE
        got += len(chunk)
    # The last read's bytes are charged after it returns: 1 MB minus that read and one burst, at 100 kB/s.
    assert trio.current_time() - start == pytest.approx((1_000_000 - len(chunk) - SLICE) / 100_000)


async def test_a_data_plane_frame_goes_out_slice_by_slice_at_the_upload_cap(autojump_clock):
    asker_keys, provider_keys = key_pair_sessions()
    left, right = trio.testing.memory_stream_pair()
    bandwidth = Bandwidth()
    bandwidth.upload.set_rate(1 * MB)
    writer, reader = SealedStream(left, asker_keys, bandwidth=bandwidth), SealedStream(right, provider_keys)
    reader.limit_frames(8 * MB)
    payload = bytes(range(256)) * (4 * 4096)  # 4 MiB
    received = []
    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer.write, payload)
        while sum(map(len, received)) < len(payload):
            received.append(await reader.read())
    elapsed = trio.current_time() - start
    assert b"".join(received) == payload
    sent = bandwidth.upload.total
    assert sent > len(payload)  # the header and tag too
    assert elapsed == pytest.approx((sent - bandwidth.upload.burst) / MB, rel=0.02)


async def test_data_plane_reads_are_held_to_the_download_cap(autojump_clock):
    asker_keys, provider_keys = key_pair_sessions()
    left, right = trio.testing.memory_stream_pair()
    bandwidth = Bandwidth()
    bandwidth.download.set_rate(1 * MB)
    writer, reader = SealedStream(left, asker_keys), SealedStream(right, provider_keys, bandwidth=bandwidth)
    reader.limit_frames(8 * MB)
    payload = bytes(2 * MB)
    got = 0
    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer.write, payload)
        while got < len(payload):
            got += len(await reader.read())
    assert trio.current_time() - start >= (len(payload) - bandwidth.download.burst - SLICE) / MB


# --- configuration ----------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ("10MB/s", 10 * MB), ("512KiB/s", 512 * 1024), ("8Mbit/s", MB), ("2M", 2 * 1024 * 1024), ("125000", 125_000),
    (0, 0), ("off", 0), ("1.5 GB/s", 1_500_000_000), ("100 kbit/s", 12_500), (4096, 4096),
])
def test_rates_are_read_as_people_write_them(text, expected):
    assert parse_rate(text) == expected


@pytest.mark.parametrize("text", ["fast", "10 MB/min", "-5MB/s", "10Mbps", "1e400MB/s", "", True, 1.5])
def test_a_bad_rate_is_refused(text):
    with pytest.raises(ValueError, match="is not a rate"):
        parse_rate(text)


def test_limits_come_from_the_file_the_environment_and_flags(tmp_path):
    (tmp_path / "config.toml").write_text(
        'upload_limit = "1MB/s"\ndownload_limit = 2048\ntrain_threads = 3\nschedule = ["22:00-07:00"]\n'
        'only_on_ac_power = "on"\n')
    config = load_config(data_dir=tmp_path, environ={"LOCOMESH_DOWNLOAD_LIMIT": "8Mbit/s",
                                                     "LOCOMESH_SCHEDULE": "12:00-13:00, 20:00-21:00"},
                         flags={"upload_limit": "512KiB/s"})
    assert (config.upload_limit, config.download_limit, config.train_threads) == (512 * 1024, MB, 3)
    assert config.schedule == ("12:00-13:00", "20:00-21:00")
    assert (config.only_on_ac_power, config.only_when_idle) == ("on", "off")
    defaults = load_config(data_dir=tmp_path / "none", environ={})
    assert (defaults.upload_limit, defaults.download_limit, defaults.train_threads, defaults.schedule) == (0, 0, 0, ())


@pytest.mark.parametrize(("file", "environ", "flags", "message"), [
    ('upload_limit = "lots"\n', {}, {}, r"config.toml: upload_limit: 'lots' is not a rate"),
    ("", {"LOCOMESH_DOWNLOAD_LIMIT": "10 MB/hour"}, {}, r"LOCOMESH_DOWNLOAD_LIMIT: '10 MB/hour' is not a rate"),
    ("", {}, {"upload_limit": "x"}, r"--upload-limit: 'x' is not a rate"),
    ('train_threads = "four"\n', {}, {}, r"train_threads: expected an integer"),
    ("", {"LOCOMESH_TRAIN_THREADS": "-1"}, {}, r"train_threads: -1 is not a count of threads"),
    ("schedule = \"22:00-07:00\"\n", {}, {}, r"schedule: expected a list of windows"),
    ("", {}, {"schedule": ["25:00-07:00"]}, r"schedule: '25:00-07:00' is not a window: hours run 00-23"),
    ("", {"LOCOMESH_SCHEDULE": "evenings"}, {}, r"schedule: 'evenings' is not a window like 22:00-07:00"),
    ('only_when_idle = "yes"\n', {}, {}, r"only_when_idle: 'yes' is not one of on, off"),
])
def test_a_bad_limit_names_where_it_came_from(tmp_path, file, environ, flags, message):
    (tmp_path / "config.toml").write_text(file)
    with pytest.raises(ConfigError, match=message):
        load_config(data_dir=tmp_path, environ=environ, flags=flags)


def test_node_start_flags_become_the_limits(tmp_path):
    from locomesh.cli.main import build_parser
    from locomesh.cli.node_cmd import _limit_flags

    args = build_parser().parse_args([
        "node", "start", "--upload-limit", "10MB/s", "--download-limit", "8Mbit/s", "--train-threads", "2",
        "--schedule", "22:00-07:00", "--schedule", "12:00-13:00", "--only-when-idle", "--only-on-ac-power"])
    config = load_config(data_dir=tmp_path, environ={}, flags=_limit_flags(args))
    assert (config.upload_limit, config.download_limit, config.train_threads) == (10 * MB, MB, 2)
    assert config.schedule == ("22:00-07:00", "12:00-13:00")
    assert (config.only_when_idle, config.only_on_ac_power) == ("on", "on")


def test_status_shows_the_caps_and_the_current_rates():
    from locomesh.cli.status_cmd import format_status

    bandwidth = Bandwidth(clock=lambda: 0.0)
    bandwidth.upload.set_rate(10 * MB)
    status = {"peer_id": "p", "bandwidth": {**bandwidth.status(), "upload_rate": 2 * MB}}
    text = format_status(status)
    assert "upload" in text and "(cap 9.5 MiB/s)" in text
    assert "download" in text and "(no cap)" in text


def test_train_threads_hold_torch_in_the_thread_that_trains():
    from locomesh.training.participant import Participant

    participant = Participant.__new__(Participant)
    participant.train_threads = 1
    before = torch.get_num_threads()
    seen = []

    def train_in_a_worker_thread() -> None:
        participant._limit_threads()
        seen.append(torch.get_num_threads())

    import threading

    thread = threading.Thread(target=train_in_a_worker_thread)
    thread.start()
    thread.join()
    assert seen == [1]
    assert torch.get_num_threads() == before  # the node's other threads keep theirs


# --- the schedule -----------------------------------------------------------------------------


def at(hour: int, minute: int = 0) -> datetime:
    return datetime(2026, 11, 26, hour, minute)


def test_a_window_across_midnight_covers_the_night_only():
    schedule = TrainingSchedule(["22:00-07:00"])
    assert schedule.reason_to_sit_out(at(23, 30)) is None
    assert schedule.reason_to_sit_out(at(3)) is None
    assert schedule.reason_to_sit_out(at(22)) is None
    assert schedule.reason_to_sit_out(at(7)) == "outside the schedule 22:00-07:00"
    assert schedule.reason_to_sit_out(at(12)) == "outside the schedule 22:00-07:00"


def test_several_windows_and_an_empty_schedule():
    schedule = TrainingSchedule(["9:00-12:00", "13:30-17:00"])
    assert schedule.reason_to_sit_out(at(10)) is None and schedule.reason_to_sit_out(at(14)) is None
    assert schedule.reason_to_sit_out(at(12, 45)) == "outside the schedule 09:00-12:00, 13:30-17:00"
    assert TrainingSchedule().always and TrainingSchedule().reason_to_sit_out(at(4)) is None


def test_a_window_must_be_readable_and_not_empty():
    with pytest.raises(ScheduleError, match="empty window"):
        parse_window("08:00-08:00")
    with pytest.raises(ScheduleError, match="minutes 00-59"):
        parse_window("08:00-09:60")


def test_on_battery_the_node_sits_out_and_where_the_platform_does_not_tell_it_trains(caplog):
    plugged: list[bool | None] = [False]
    schedule = TrainingSchedule(only_on_ac_power=True, ac_power=lambda: plugged[0])
    assert schedule.reason_to_sit_out(at(12)) == "on battery"
    plugged[0] = True
    assert schedule.reason_to_sit_out(at(12)) is None
    plugged[0] = None
    with caplog.at_level("INFO", logger="locomesh.node.schedule"):
        assert schedule.reason_to_sit_out(at(12)) is None
        assert schedule.reason_to_sit_out(at(12)) is None
    assert [record.getMessage() for record in caplog.records].count(
        "this platform does not tell whether it runs on battery: only_on_ac_power is not applied") == 1


def test_a_busy_machine_sits_rounds_out_and_an_idle_one_trains():
    load: list[float | None] = [0.6]
    schedule = TrainingSchedule(only_when_idle=True, others_load=lambda: load[0])
    assert schedule.reason_to_sit_out(at(12)) == "the machine is busy: other processes use 60% of the CPU"
    load[0] = 0.05
    assert schedule.reason_to_sit_out(at(12)) is None
    load[0] = None  # not known yet
    assert schedule.reason_to_sit_out(at(12)) is None


def test_the_window_is_checked_before_the_platform_is_asked():
    asked = []
    schedule = TrainingSchedule(["22:00-07:00"], only_on_ac_power=True, ac_power=lambda: asked.append(1) or False)
    assert schedule.reason_to_sit_out(at(12)) == "outside the schedule 22:00-07:00" and not asked
    assert schedule.reason_to_sit_out(at(23)) == "on battery"


def test_the_platform_probes_answer_or_say_they_cannot():
    from locomesh.node.schedule import OtherProcessesLoad, on_ac_power

    assert on_ac_power() in (True, False, None)
    probe = OtherProcessesLoad()
    assert probe() is None  # no earlier sample to measure from
    sum(range(200_000))  # some CPU of our own, which does not count
    load = probe()
    assert load is None or 0.0 <= load <= 1.0


def test_the_schedule_is_built_from_the_config(tmp_path):
    config = load_config(data_dir=tmp_path, environ={}, flags={"schedule": ["22:00-07:00"], "only_when_idle": "on"})
    schedule = TrainingSchedule.from_config(config)
    assert schedule.describe() == "trains between 22:00-07:00 and when idle"


# --- measured on loopback, between real daemons ------------------------------------------------


@pytest.fixture
def log(tmp_path):
    with open(tmp_path / "daemons.log", "wb") as file:
        yield file


def _checkpoint(directory: Path, megabytes: int) -> tuple[bytes, int]:
    rng = np.random.default_rng(7)
    tensors = {"w": torch.from_numpy(rng.standard_normal(megabytes * MB // 4).astype(np.float32))}
    manifest = write_checkpoint(directory, tensors, {"round": 1, "run": b""})
    return manifest.id, sum(chunk.size for chunk in manifest.chunks)  # the bytes that travel


@pytest.mark.slow
@pytest.mark.parametrize("capped", ["downloader", "provider"])
def test_a_10_mb_per_s_cap_holds_a_checkpoint_download_to_it(tmp_path, log, capped):
    """About 24 MB over the data plane, the downloader's download or the provider's upload capped at
    10 MB/s: the transfer takes at least 24 MB / 11 MB/s (the measured rate is in bench/rate_caps.py)."""
    checkpoint_id, size = _checkpoint(tmp_path / "provider" / "checkpoints", 24)
    limits = {"downloader": ["--download-limit", "10MB/s"], "provider": ["--upload-limit", "10MB/s"]}
    daemons = {}
    try:
        for name in ("downloader", "provider"):
            daemons[name] = DaemonProcess(tmp_path / name, log=log, extra_args=limits[name] if name == capped else [])
            daemons[name].start()
        for daemon in daemons.values():
            daemon.wait_ready()
        provider_address = daemons["provider"].rpc().call("node.status")["listen_addrs"][0]
        start = time.monotonic()
        request = {"id": checkpoint_id.hex(), "providers": [provider_address]}
        daemons["downloader"].rpc().call("checkpoint.fetch", request)
        while (progress := daemons["downloader"].rpc().call("checkpoint.progress", {"id": checkpoint_id.hex()}))[
                "state"] in ("manifest", "chunks"):
            assert time.monotonic() - start < 120, progress
            time.sleep(0.05)
        elapsed = time.monotonic() - start
        bandwidth = daemons[capped].rpc().call("node.status")["bandwidth"]
    finally:
        for daemon in daemons.values():
            daemon.stop()
    assert progress["state"] == "done", progress
    assert size / elapsed <= 11 * MB, f"{size / elapsed / MB:.1f} MB/s under a 10 MB/s cap"
    direction = "download" if capped == "downloader" else "upload"
    assert bandwidth[f"{direction}_limit"] == 10 * MB
    assert bandwidth[f"{direction}_rate"] > 0


# --- the relay service's circuits ---------------------------------------------------------------


async def test_a_relays_upload_cap_holds_the_circuits_it_relays(nursery, identity_factory):
    """Relayed bytes travel on the relay's own connections, so its caps pace them (node/meter.py):
    3 MB relayed under a 1 MB/s upload cap take at least 3 MB / 1.1 MB/s."""
    from multiaddr import Multiaddr

    from locomesh.node.nat.reachability import PRIVATE, PUBLIC
    from locomesh.node.nat.relay_service import RelayService

    from .test_nat_relay import start, wait_for

    relay_service = RelayService(lambda: PUBLIC, hole_punch=False)
    relay = await start(nursery, identity_factory(51), relay_service)
    bootstrap = [Multiaddr(relay.listen_addresses()[0])]
    listener_service = RelayService(lambda: PRIVATE, hole_punch=False)
    listener = await start(nursery, identity_factory(52), listener_service, bootstrap)
    dialer_service = RelayService(lambda: PRIVATE, reservations=0, hole_punch=False)
    dialer = await start(nursery, identity_factory(53), dialer_service, bootstrap)
    await wait_for(lambda: relay_service.offering and len(relay.peers) == 2)
    await wait_for(lambda: listener_service.relay_candidates() == [relay.peer_id])
    await listener_service.adjust(nursery)
    assert await dialer_service.connect(listener.peer_id, listener_service.relay_addrs()) == "relayed"

    size, received = 3 * MB, trio.Event()

    async def sink(stream) -> None:
        got = 0
        while got < size and (data := await stream.read(SLICE)):
            got += len(data)
        received.set()

    listener.set_stream_handler("/locomesh-test/sink/1", sink, timeout=60)
    upload = relay.meter.bandwidth.upload
    upload.set_rate(1 * MB)
    relayed_before = upload.total
    stream = await dialer.open_stream(listener.peer_id, ["/locomesh-test/sink/1"])
    start_time = trio.current_time()
    for _ in range(size // SLICE + 1):
        await stream.write(bytes(SLICE))
    with trio.fail_after(60):
        await received.wait()
    elapsed = trio.current_time() - start_time
    assert upload.total - relayed_before >= size  # the relayed bytes went through the relay's bucket
    assert size / elapsed <= 1.1 * MB
    for node in (relay, listener, dialer):
        node.request_stop()
