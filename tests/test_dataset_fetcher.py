"""The dataset fetcher's bookkeeping that needs no network: which fetched shards it deletes, and the
round assignment `RunData` hands to training."""

from __future__ import annotations

from types import SimpleNamespace

from locomesh.node.datasets.service import DatasetFetcher, RunData
from locomesh.node.transfer.store import has_checkpoint
from locomesh.training.data.assignment import assigned
from tests.corpus import pack_corpus


def fetcher_on(store):
    withdrawn = []
    checkpoints = SimpleNamespace(directory=store, withdraw=withdrawn.append)
    return DatasetFetcher(None, checkpoints), withdrawn


async def test_the_least_recently_used_fetched_shards_go_and_packed_ones_stay(tmp_path):
    packed = pack_corpus(tmp_path / "store", tmp_path / "corpus", count=120, shard_tokens=128)
    train = packed.index.train
    fetcher, withdrawn = fetcher_on(tmp_path / "store")
    for shard in train[:5]:  # as if these five had come from peers, in this order
        fetcher.fetched[shard] = None
    await fetcher.forget_beyond(2, used=[train[3]])
    assert [has_checkpoint(tmp_path / "store", shard) for shard in train[:5]] == [False, False, False, True, True]
    assert withdrawn == list(train[:3]), "deleted shards are no longer announced"
    assert list(fetcher.fetched) == [train[4], train[3]]
    assert all(has_checkpoint(tmp_path / "store", shard) for shard in train[5:]), "shards packed here stay"


def test_a_member_is_handed_the_shards_the_assignment_gives_it(tmp_path):
    packed = pack_corpus(tmp_path / "store", tmp_path / "corpus", count=120, shard_tokens=128)
    fetcher, _ = fetcher_on(tmp_path / "store")
    me, other = b"\x01" * 32, b"\x02" * 32
    data = RunData(fetcher, packed.id, packed.index, seed=3, me=me, tokens_per_round=300)
    assert data.per_member == 3
    for round_number in range(1, 4):
        positions = assigned(len(packed.index.train), 3, round_number, sorted([me, other]), me, 3)
        assert data.assigned_ids(round_number, [other]) == [packed.index.train[p] for p in positions]
