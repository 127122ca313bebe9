"""The Tendermint machine (node/agreement/tendermint.py), rule by rule of Algorithm 1, on logs built
by hand: each test names the paper's line it holds."""

from __future__ import annotations

import pytest

from locomesh.crdt import Value
from locomesh.node.agreement import tendermint as tm
from locomesh.node.agreement.log import NIL, Log, Proposal

KEYS = [bytes([i]) * 32 for i in range(1, 5)]  # four members: 2f + 1 = 3, f + 1 = 2
ME, A, B, C = KEYS
V = Value(1, (b"\x10" * 32,))
W = Value(1, (b"\x20" * 32,))
STATE = b"\x55" * 32
TIMEOUTS = tm.Timeouts(propose=10.0, prevote=2.0, precommit=2.0, growth=1.0)


def log(proposals=(), prevotes=(), precommits=()) -> Log:
    """A log of round 1, epoch 0: `proposals` (attempt, value, valid round); `prevotes` and
    `precommits` (attempt, author, value ID)."""
    made = Log(1, 0, frozenset(KEYS), ME)
    for attempt, value, valid_round in proposals:
        made.proposals.setdefault(attempt, []).append(Proposal(attempt, value, valid_round, b"op"))
        made.senders.setdefault(attempt, set()).add(proposer(attempt))
    for attempt, author, value_id in prevotes:
        made._count(made.prevotes, author, attempt, value_id)
        if author == ME:
            made.own_prevotes[attempt] = value_id
    for attempt, author, value_id in precommits:
        made._count(made.precommits, author, attempt, value_id)
        if author == ME:
            made.own_precommits[attempt] = (value_id, STATE if value_id else NIL)
    return made


def proposer(attempt: int) -> bytes:
    return KEYS[(attempt + 1) % 4]  # attempt 0: A, 1: B, 2: C, 3: ME


def machine(**fields) -> tm.Machine:
    return tm.Machine(1, 0, ME, proposer, timeouts=TIMEOUTS, **fields)


def started(at: float = 0.0, **fields) -> tm.Machine:
    made = machine(**fields)
    assert made.start(log(), at) == []
    return made


def test_a_member_that_does_not_propose_waits_for_the_proposal_until_its_timeout_lines_11_21_57():
    m = started()
    assert m.step is tm.Step.PROPOSE and m.timers["propose"] == (0, 10.0)
    assert m.handle(tm.Observe(log(), 9.9)) == []
    assert m.handle(tm.Observe(log(), 10.0)) == [tm.Prevote(0, NIL)]  # line 59
    assert m.step is tm.Step.PREVOTE


def test_the_proposer_asks_for_a_value_and_proposes_what_comes_lines_14_19():
    m = machine()
    m.proposer = lambda attempt: ME
    assert m.start(log(), 0.0) == [tm.NeedValue(0)]
    assert "propose" not in m.timers  # line 21 is the others' branch
    assert m.handle(tm.ValueReady(0, V)) == [tm.Propose(0, V, -1)]


def test_a_proposer_with_nothing_valid_to_propose_prevotes_nil():
    m = machine()
    m.proposer = lambda attempt: ME
    m.start(log(), 0.0)
    assert m.handle(tm.ValueReady(0, None)) == [tm.Prevote(0, NIL)]


def test_a_proposer_with_a_valid_value_proposes_it_with_its_valid_round_lines_15_16():
    m = machine(valid=W, valid_round=2)
    m.proposer = lambda attempt: ME
    assert m.start(log(), 0.0) == [tm.Propose(0, W, 2)]


def test_a_proposal_is_checked_then_prevoted_and_its_state_asked_for_lines_22_24():
    m = started()
    assert m.handle(tm.Observe(log(proposals=[(0, V, -1)]), 1.0)) == [tm.Check(V)]
    assert m.step is tm.Step.PROPOSE  # valid(v) not known yet
    assert m.handle(tm.Checked(V.id, True)) == [tm.Prevote(0, V.id), tm.Hash(V)]
    assert m.step is tm.Step.PREVOTE


def test_an_invalid_proposal_is_prevoted_nil_line_26():
    m = started()
    m.handle(tm.Observe(log(proposals=[(0, V, -1)]), 1.0))
    assert m.handle(tm.Checked(V.id, False)) == [tm.Prevote(0, NIL)]


def test_a_member_locked_on_another_value_prevotes_nil_without_checking_line_23():
    m = started(locked=W, locked_round=0)
    assert m.handle(tm.Observe(log(proposals=[(0, V, -1)]), 1.0)) == [tm.Prevote(0, NIL)]


def test_a_proposal_with_a_valid_round_needs_its_prevotes_and_unlocks_lines_28_32():
    m = started(locked=W, locked_round=0)
    m._start_round(2)
    proposal = [(2, V, 1)]
    assert m.handle(tm.Observe(log(proposals=proposal), 1.0)) == []  # no 2f + 1 prevotes in round 1 yet
    polka = [(1, author, V.id) for author in (A, B, C)]
    assert m.handle(tm.Observe(log(proposals=proposal, prevotes=polka), 1.0)) == [tm.Check(V)]
    assert m.handle(tm.Checked(V.id, True)) == [tm.Prevote(2, V.id), tm.Hash(V)]  # lockedRound 0 <= vr 1


def test_two_thirds_of_prevotes_for_a_proposal_lock_it_and_the_precommit_waits_for_its_hash_lines_36_43():
    m = started()
    m.handle(tm.Observe(log(proposals=[(0, V, -1)]), 1.0))
    m.handle(tm.Checked(V.id, True))
    polka = log(proposals=[(0, V, -1)], prevotes=[(0, author, V.id) for author in (A, B, ME)])
    assert m.handle(tm.Observe(polka, 2.0)) == []  # locked, but no hash yet
    assert (m.locked, m.locked_round, m.valid, m.valid_round, m.step) == (V, 0, V, 0, tm.Step.PRECOMMIT)
    assert m.handle(tm.Hashed(V.id, STATE)) == [tm.Precommit(0, V.id, STATE)]


def test_a_value_whose_state_cannot_be_computed_is_precommitted_nil():
    m = started()
    m.handle(tm.Observe(log(proposals=[(0, V, -1)]), 1.0))
    m.handle(tm.Checked(V.id, True))
    m.handle(tm.Observe(log(proposals=[(0, V, -1)], prevotes=[(0, a, V.id) for a in (A, B, ME)]), 2.0))
    assert m.handle(tm.Hashed(V.id, None)) == [tm.Precommit(0, NIL, NIL)]


def test_two_thirds_of_prevotes_of_any_kind_start_the_prevote_timeout_lines_34_35_61_64():
    m = started()
    m.handle(tm.Observe(log(), 10.0))  # our nil prevote
    mixed = log(prevotes=[(0, ME, NIL), (0, A, V.id), (0, B, W.id)])
    assert m.handle(tm.Observe(mixed, 11.0)) == [] and m.timers["prevote"] == (0, 13.0)
    assert m.handle(tm.Observe(mixed, 13.0)) == [tm.Precommit(0, NIL, NIL)]
    assert m.step is tm.Step.PRECOMMIT


def test_two_thirds_of_nil_prevotes_precommit_nil_lines_44_46():
    m = started()
    m.handle(tm.Observe(log(), 10.0))
    assert m.handle(tm.Observe(log(prevotes=[(0, a, NIL) for a in (ME, A, B)]), 11.0)) == [tm.Precommit(0, NIL, NIL)]


def test_two_thirds_of_precommits_start_the_precommit_timeout_then_the_next_attempt_lines_47_48_65_67():
    m = started()
    m.handle(tm.Observe(log(), 10.0))
    nil = log(prevotes=[(0, a, NIL) for a in (ME, A, B)], precommits=[(0, a, NIL) for a in (ME, A, B)])
    m.handle(tm.Observe(nil, 11.0))
    assert m.timers["precommit"] == (0, 13.0)
    assert m.handle(tm.Observe(nil, 13.0)) == []
    assert (m.attempt, m.step) == (1, tm.Step.PROPOSE) and m.timers["propose"] == (1, 13.0 + 11.0)  # grows


def test_a_third_of_the_members_in_a_later_attempt_move_us_there_lines_55_56():
    m = started()
    ahead = log(prevotes=[(3, A, NIL)])
    assert m.handle(tm.Observe(ahead, 1.0)) == [] and m.attempt == 0  # f + 1 = 2
    moved = m.handle(tm.Observe(log(prevotes=[(3, A, NIL), (3, B, NIL)]), 1.0))
    assert m.attempt == 3 and moved == [tm.NeedValue(3)]  # attempt 3 is ours to propose


def test_a_restarted_member_resumes_at_its_newest_attempt_with_its_lock():
    before = log(proposals=[(1, V, -1)], prevotes=[(1, ME, V.id)], precommits=[(1, ME, V.id)])
    m = machine()
    assert m.start(before, 5.0) == []
    assert (m.attempt, m.step, m.locked, m.locked_round) == (1, tm.Step.PRECOMMIT, V, 1)
    assert m.handle(tm.Observe(before, 6.0)) == []  # it says nothing twice


def test_a_member_that_signed_a_recover_earlier_in_the_epoch_sends_nothing():
    m = started(abstain=True)
    assert m.handle(tm.Observe(log(proposals=[(0, V, -1)]), 1.0)) == [tm.Check(V)]
    assert m.handle(tm.Checked(V.id, True)) == [tm.Hash(V)]  # no prevote
    assert m.step is tm.Step.PREVOTE


def test_answers_nobody_asked_for_are_impossible():
    m = started()
    with pytest.raises(tm.ImpossibleEvent):
        m.handle(tm.Checked(V.id, True))
    with pytest.raises(tm.ImpossibleEvent):
        m.handle(tm.Hashed(V.id, STATE))
    with pytest.raises(tm.ImpossibleEvent):
        machine().handle(tm.ValueReady(0, V))  # before start


def test_every_rule_of_the_table_names_a_line_of_algorithm_1_in_the_docstring():
    for rule in tm.RULES:
        assert f"\n    {rule.line}  " in tm.__doc__
