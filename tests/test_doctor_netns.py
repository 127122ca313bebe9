"""`locomesh doctor` behind a home router whose gateway refuses port mappings (network-namespace lab).

host1's router answers NAT-PMP but refuses every mapping (result code 2, "not authorized"), as a
router with port forwarding switched off by its owner does, and offers no UPnP. The node finds
itself private, asks, is refused; doctor, run inside host1's namespace, reports the refusal with
the fix (turn UPnP/NAT-PMP on, or forward the port by hand), and the private verdict with the
relay that carries the node meanwhile. Needs root (namespaces, nftables): skipped elsewhere.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .netns_lab import PORT, rpc, start_three, wait_private_with_reservation, wait_until
from .test_nat_netns import lab_factory  # noqa: F401 - the fixture

# A NAT-PMP gateway on host1's router that tells its public address and refuses every mapping.
_REFUSING_GATEWAY = r"""
import socket, struct, sys
lan_ip, public_ip = sys.argv[1], sys.argv[2]
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sock.bind((lan_ip, 5351))
print("ready", flush=True)
while True:
    data, address = sock.recvfrom(64)
    if data == b"\0\0":
        reply = struct.pack("!BBHI", 0, 128, 0, 0) + socket.inet_aton(public_ip)
    elif len(data) == 12 and data[:2] == b"\0\x02":
        internal = struct.unpack("!H", data[4:6])[0]
        reply = struct.pack("!BBHIHHI", 0, 130, 2, 0, internal, 0, 0)  # result 2: not authorized / refused
    else:
        reply = struct.pack("!BBHI", 0, 128 + (data[1] if len(data) > 1 else 0), 5, 0)
    sock.sendto(reply, address)
"""


@pytest.mark.slow
def test_doctor_explains_a_gateway_that_refuses_mappings(lab_factory, tmp_path):  # noqa: F811
    from .netns_lab import NAT_PUBLIC_IPS

    lab, start = lab_factory(symmetric=False)
    gateway = subprocess.Popen(
        [*lab.exec_prefix(lab.nat_ns[0]), sys.executable, "-c", _REFUSING_GATEWAY, "10.1.0.1", NAT_PUBLIC_IPS[0]],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert gateway.stdout.readline().strip() == "ready", "the refusing NAT-PMP gateway did not start"
        relay_id, _, _ = start_three(lab, start, tmp_path)
        wait_private_with_reservation(lab, tmp_path, relay_id)
        host1 = (lab.host_ns[0], tmp_path / "host1")
        wait_until("host1's mapping is refused",
                   lambda: rpc(*host1, "node.status")["port_mapping"]["state"] == "failed", 60)
        done = subprocess.run(
            [*lab.exec_prefix(lab.host_ns[0]), sys.executable, "-m", "locomesh.cli.main", "doctor", "--json",
             "--data-dir", str(tmp_path / "host1")],
            capture_output=True, text=True, timeout=240,
        )
    finally:
        gateway.kill()
        gateway.wait(timeout=10)
    report = json.loads(done.stdout)
    checks = {check["name"]: check for check in report["checks"]}
    mapping = checks["port mapping"]
    assert mapping["status"] == "warn" and "gateway-refused" in mapping["detail"], mapping
    assert "UPnP or NAT-PMP" in mapping["fix"] and f"forward TCP port {PORT}" in mapping["fix"]
    assert checks["reachability"]["status"] == "warn" and "private" in checks["reachability"]["detail"]
    assert checks["relays"]["status"] == "ok" and "reserved on 1 relay" in checks["relays"]["detail"]
    assert checks["bootstrap"]["status"] == "ok"
    # Behind a refusing gateway the node still takes part, through its relay: a warning, not a failure.
    assert done.returncode == 0 and report["ok"] is True
