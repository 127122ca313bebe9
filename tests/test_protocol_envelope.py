"""Envelopes: round trips for every kind, and every way a message can be bad."""

from __future__ import annotations

import msgpack
import pytest

from locomesh.protocol import KINDS, Envelope, ProtocolError, decode, encode, pack, sign
from locomesh.protocol.envelope import signing_bytes
from locomesh.protocol.kinds import MessageKind, register
from locomesh.protocol.schema import Int, Struct

from .samples import sample_body

RUN = bytes(range(32))
OTHER_RUN = bytes(32)


def _run_for(kind: str) -> bytes:
    return RUN if KINDS[kind].run_scoped else b""


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_kind_round_trips(kind, identity_factory):
    alice = identity_factory(1)
    body = sample_body(kind)
    data = encode(alice, kind, body, run=_run_for(kind))
    message = decode(data, run=_run_for(kind) or None)
    assert message.kind == kind
    assert message.body == body
    assert message.author == alice.public_key
    assert message.author_peer_id == alice.peer_id
    assert message.encode() == data


def _resigned(identity, raw: dict) -> bytes:
    """An envelope whose signature is valid for whatever `raw` now holds."""
    raw["sig"] = identity.sign(signing_bytes(raw["v"], raw["kind"], raw["run"], raw["author"], raw["body"]))
    return pack(raw)


def _raw(identity, kind="node.ping", body=None, run=b"") -> dict:
    return msgpack.unpackb(encode(identity, kind, body or sample_body(kind), run=run), raw=False)


def test_bad_signature_is_rejected(identity_factory):
    raw = _raw(identity_factory(1))
    raw["sig"] = bytes(64)
    with pytest.raises(ProtocolError) as excinfo:
        decode(pack(raw))
    assert excinfo.value.code == "bad-signature"


def test_signature_of_another_author_is_rejected(identity_factory):
    raw = _raw(identity_factory(1))
    raw["author"] = identity_factory(2).public_key
    with pytest.raises(ProtocolError, match="bad-signature"):
        decode(pack(raw))


def test_tampered_body_breaks_the_signature(identity_factory):
    raw = _raw(identity_factory(1))
    raw["body"]["nonce"] = b"x" * 8
    with pytest.raises(ProtocolError, match="bad-signature"):
        decode(pack(raw))


def test_wrong_run_is_rejected(identity_factory):
    run_scoped = sorted(name for name, k in KINDS.items() if k.run_scoped)
    if not run_scoped:
        pytest.skip("no run-scoped kind registered yet")
    kind = run_scoped[0]
    data = encode(identity_factory(1), kind, sample_body(kind), run=RUN)
    with pytest.raises(ProtocolError) as excinfo:
        decode(data, run=OTHER_RUN)
    assert excinfo.value.code == "wrong-run"


def test_run_on_a_runless_kind_is_rejected(identity_factory):
    alice = identity_factory(1)
    raw = _raw(alice)
    raw["run"] = RUN
    with pytest.raises(ProtocolError) as excinfo:
        decode(_resigned(alice, raw))
    assert excinfo.value.code == "wrong-run"


def test_unknown_kind_is_rejected(identity_factory):
    alice = identity_factory(1)
    raw = _raw(alice)
    raw["kind"] = "no.such.kind"
    with pytest.raises(ProtocolError) as excinfo:
        decode(_resigned(alice, raw))
    assert excinfo.value.code == "unknown-kind"


def test_unexpected_kind_is_rejected(identity_factory):
    data = encode(identity_factory(1), "node.ping", sample_body("node.ping"))
    with pytest.raises(ProtocolError) as excinfo:
        decode(data, kinds=frozenset({"peer.record"}))
    assert excinfo.value.code == "unexpected-kind"


@pytest.mark.parametrize("version", [2, 1.0, True, "1"], ids=repr)
def test_wrong_version_is_rejected(identity_factory, version):
    """1.0 and True compare equal to 1: accepting them would give one message two signed forms."""
    alice = identity_factory(1)
    raw = _raw(alice)
    raw["v"] = version
    with pytest.raises(ProtocolError) as excinfo:
        decode(_resigned(alice, raw))
    assert excinfo.value.code == "bad-version"


@pytest.mark.parametrize(
    "change",
    [
        lambda raw: raw.pop("sig"),
        lambda raw: raw.update(extra=1),
        lambda raw: raw.update(author=b"short"),
        lambda raw: raw.update(sig=b"short"),
        lambda raw: raw.update(run=7),
        lambda raw: raw.update(kind=5),
    ],
    ids=["missing-field", "extra-field", "short-author", "short-sig", "run-not-bytes", "kind-not-str"],
)
def test_malformed_envelope_is_rejected(identity_factory, change):
    raw = _raw(identity_factory(1))
    change(raw)
    with pytest.raises(ProtocolError):
        decode(pack(raw))


def test_schema_violation_is_rejected_even_when_signed(identity_factory):
    alice = identity_factory(1)
    raw = _raw(alice)
    raw["body"] = {"nonce": b"short"}
    with pytest.raises(ProtocolError) as excinfo:
        decode(_resigned(alice, raw))
    assert excinfo.value.code == "bad-field"
    assert "nonce" in excinfo.value.reason


@pytest.mark.parametrize("value", [["open"], {"a": 1}, 1, None], ids=repr)
def test_one_of_field_with_a_value_of_another_type_is_rejected(identity_factory, value):
    """Found by bench/protocol_fuzz.py: an unhashable value made `in frozenset` raise TypeError."""
    alice = identity_factory(1)
    raw = _raw(alice, "run.manifest")
    raw["body"]["admission"] = value
    with pytest.raises(ProtocolError) as excinfo:
        decode(_resigned(alice, raw))
    assert excinfo.value.code == "bad-field"


def test_sign_refuses_a_body_that_breaks_the_schema(identity_factory):
    with pytest.raises(ProtocolError, match="bad-field"):
        sign(identity_factory(1), "node.ping", {"nonce": 5})


def test_oversized_for_its_kind_is_rejected(identity_factory):
    alice = identity_factory(1)
    raw = _raw(alice, "peer.record")
    raw["body"]["addrs"] = ["/ip4/127.0.0.1/tcp/1/" + "x" * 490] * 64 + []
    data = _resigned(alice, raw)
    assert len(data) > KINDS["peer.record"].max_size
    with pytest.raises(ProtocolError) as excinfo:
        decode(data)
    assert excinfo.value.code in {"too-large", "bad-field"}


def test_oversized_input_is_rejected_before_parsing():
    from locomesh.protocol.kinds import max_envelope_size

    with pytest.raises(ProtocolError) as excinfo:
        decode(b"\x00" * (max_envelope_size() + 1))
    assert excinfo.value.code == "too-large"


@pytest.mark.parametrize("cut", [1, 10, 50, -1])
def test_truncated_input_is_rejected(identity_factory, cut):
    data = encode(identity_factory(1), "node.ping", sample_body("node.ping"))
    with pytest.raises(ProtocolError):
        decode(data[:cut])


def test_empty_input_is_rejected():
    with pytest.raises(ProtocolError, match="truncated"):
        decode(b"")


def test_non_canonical_encoding_is_rejected(identity_factory):
    """Same value, other bytes: keys out of order, or a wider integer form."""
    data = encode(identity_factory(1), "node.ping", sample_body("node.ping"))
    raw = msgpack.unpackb(data, raw=False)
    reordered = msgpack.packb(dict(reversed(list(raw.items()))), use_bin_type=True)
    assert reordered != data
    with pytest.raises(ProtocolError, match="non-canonical"):
        decode(reordered)
    wide_version = data.replace(b"\xa1v\x01", b"\xa1v\xcd\x00\x01", 1)
    assert wide_version != data
    with pytest.raises(ProtocolError, match="non-canonical"):
        decode(wide_version)


def test_trailing_bytes_are_rejected(identity_factory):
    data = encode(identity_factory(1), "node.ping", sample_body("node.ping"))
    with pytest.raises(ProtocolError, match="trailing-bytes"):
        decode(data + b"\x00")


def test_envelope_is_immutable_value(identity_factory):
    envelope = sign(identity_factory(1), "node.ping", sample_body("node.ping"))
    assert isinstance(envelope, Envelope)
    with pytest.raises(AttributeError):
        envelope.kind = "other"  # type: ignore[misc]


def test_a_kind_is_registered_once():
    with pytest.raises(ValueError):
        register(MessageKind("node.ping", Struct({"x": Int()}), 100))
