"""What `run.status` says when a run's participation stops on an error."""

from __future__ import annotations

from locomesh.node.rounds.service import _describe


def test_a_failure_names_the_exceptions_inside_the_nursery_groups():
    """A bug under a nursery surfaces as an ExceptionGroup; its own type and message are what a user needs."""
    error = ExceptionGroup("Exceptions from Trio nursery", [
        ExceptionGroup("Exceptions from Trio nursery", [NameError("name 'run_at_low_priority' is not defined")]),
        ValueError("the aggregate is not finite"),
    ])
    assert _describe(error) == "NameError: name 'run_at_low_priority' is not defined; ValueError: the aggregate is not finite"
    assert _describe(OSError("disk full")) == "OSError: disk full"
