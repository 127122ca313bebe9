"""The `RoundParticipant` contract (training/contract.py): exactly what node/rounds/ (with the state
store it loads states through, node/transfer/store.py, the run's data, node/datasets/, and the
exchange of payloads, node/exchange/) uses of
a participant, and both the real and the simulated participant implement it."""

from __future__ import annotations

import ast
import inspect
import typing
from pathlib import Path
from types import SimpleNamespace

import pytest

import locomesh.node.datasets
import locomesh.node.rounds
import locomesh.node.transfer.store
import locomesh.training.contract as contract
import locomesh.training.participant as real
from locomesh.netsim.sim_participant import SimCost, SimParticipant
from locomesh.training.contract import OuterShape, RoundParticipant, TrainingSettings
from locomesh.training.participant import Participant

BODY = {"task": "synthetic-lm", "task_config": {"d_model": 32, "n_layer": 1, "n_head": 2}, "seed": 3,
        "hparams": {"inner_steps": 2, "batch_size": 4}}
KEY = b"\x01" * 32


def _members(protocol: type) -> list[str]:
    return sorted(name for name in vars(protocol) if not name.startswith("_"))


PARTICIPANTS = {"Participant": lambda: Participant.for_run(BODY, KEY),
                "SimParticipant": lambda: SimParticipant(BODY, KEY, SimCost())}


def _is_participant(expression: ast.expr) -> bool:
    """`participant` or `<anything>.participant`."""
    return (isinstance(expression, ast.Name) and expression.id == "participant") or (
        isinstance(expression, ast.Attribute) and expression.attr == "participant")


def _used_by_the_rounds() -> dict[str, set[str]]:
    """What node/rounds/*.py, node/exchange/*.py (allgather and sharded exchange), the state store and
    node/datasets/ read of a participant, and of its `settings` and `outer`."""
    used: dict[str, set[str]] = {"participant": set(), "settings": set(), "outer": set()}
    paths = [*Path(locomesh.node.rounds.__file__).parent.glob("*.py"), Path(locomesh.node.transfer.store.__file__),
             *Path(locomesh.node.datasets.__file__).parent.glob("*.py"),
             *Path(locomesh.node.rounds.__file__).parent.parent.joinpath("exchange").glob("*.py")]
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Attribute):
                continue
            if _is_participant(node.value):
                used["participant"].add(node.attr)
            elif isinstance(node.value, ast.Attribute) and node.value.attr in used and _is_participant(node.value.value):
                used[node.value.attr].add(node.attr)
    return used


def test_the_contract_lists_exactly_what_the_rounds_use():
    used = _used_by_the_rounds()
    assert used["participant"], "found no use of a participant in node/rounds/: the scan is broken"
    assert sorted(used["participant"]) == _members(RoundParticipant)
    assert sorted(used["settings"]) == _members(TrainingSettings)
    assert sorted(used["outer"]) == _members(OuterShape)


@pytest.mark.parametrize("kind", PARTICIPANTS)
def test_the_real_and_the_simulated_participant_implement_it(kind):
    """Every member, each method taking the contract's parameters by the same names (isinstance
    checks only that the members exist)."""
    participant = PARTICIPANTS[kind]()
    assert isinstance(participant, RoundParticipant)
    assert isinstance(participant.settings, TrainingSettings)
    assert isinstance(participant.outer, OuterShape)
    for name in _members(RoundParticipant):
        wanted = getattr(RoundParticipant, name)
        if isinstance(wanted, property):
            continue
        wanted_parameters = list(inspect.signature(wanted).parameters.values())[1:]  # less self
        given = inspect.signature(getattr(participant, name)).parameters
        assert list(given)[:len(wanted_parameters)] == [p.name for p in wanted_parameters], name
        for parameter in wanted_parameters:  # what the contract lets a caller leave out, it must too
            if parameter.default is not inspect.Parameter.empty:
                assert given[parameter.name].default is not inspect.Parameter.empty, (name, parameter.name)
        required = [p for p in list(given.values())[len(wanted_parameters):] if p.default is inspect.Parameter.empty]
        assert not required, (name, required)


@pytest.mark.parametrize("missing", _members(RoundParticipant))
def test_an_object_missing_any_member_is_not_a_participant(missing):
    participant = SimParticipant(BODY, KEY, SimCost())
    members = {name: getattr(participant, name) for name in _members(RoundParticipant)}
    assert isinstance(SimpleNamespace(**members), RoundParticipant)
    del members[missing]
    assert not isinstance(SimpleNamespace(**members), RoundParticipant)


def test_the_contract_names_types_that_exist():
    """Its annotations resolve (the participant module's types are imported for type checking only)."""
    names = {**vars(contract), **vars(real)}
    for name in _members(RoundParticipant):
        member = getattr(RoundParticipant, name)
        function = member.fget if isinstance(member, property) else member
        assert typing.get_type_hints(function, globalns=names), name
