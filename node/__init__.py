"""locomesh.node: the daemon (libp2p host, services, local RPC, metrics, data dir, config).

This package's `__init__` stays light (no libp2p import), so the CLI client
can use `version()` without paying for the network stack.
"""

from __future__ import annotations

from importlib import metadata


def version() -> str:
    """The installed locomesh version ("0+unknown" when running from an uninstalled tree)."""
    try:
        return metadata.version("locomesh")
    except metadata.PackageNotFoundError:
        return "0+unknown"
