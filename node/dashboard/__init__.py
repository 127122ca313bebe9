"""The dashboard: the node's web pages at http://127.0.0.1:PORT/, served beside its RPC.

Modules, one role each:

* `app`: `Dashboard`, the part the daemon plugs into its local HTTP server, and its RPC methods;
* `routes`: the HTTP endpoints (login, pages, assets, the read-only JSON-RPC the pages poll);
* `auth`: one-time login tokens, sessions and CSRF tokens (no I/O);
* `telemetry`: traffic over time and per-peer round trips and bytes (``node.traffic``);
* `static/`: the page shell, its script, its charts and its style: no build step, nothing from
  outside the machine.
"""

from locomesh.node.dashboard.app import Dashboard

__all__ = ["Dashboard"]
