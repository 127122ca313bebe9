"""The states of a checkpoint download (`download.DownloadProgress.state`), in a module of their own
so that the CLI can read them without importing the transfer machinery (libp2p)."""

from __future__ import annotations

RUNNING_STATES = ("manifest", "chunks")  # manifest -> chunks -> one of ENDED_STATES
ENDED_STATES = ("done", "failed", "cancelled")
