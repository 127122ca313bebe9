"""Configuration: defaults < file < environment < flags, and clear errors for bad values."""

from __future__ import annotations

from pathlib import Path

import pytest

from locomesh.node.config import DEFAULT_LISTEN, ConfigError, load_config

PEER = "12D3KooWFr85krN6VkvzJwKCGkESrFRrSgSbLnKAa3JiHBrXQWMs"
BOOT_A = f"/ip4/10.0.0.1/tcp/4001/p2p/{PEER}"
BOOT_B = f"/ip4/10.0.0.2/tcp/4001/p2p/{PEER}"


def write_config(directory: Path, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "config.toml"
    path.write_text(text)
    return path


def test_defaults(tmp_path):
    config = load_config(data_dir=tmp_path, environ={})
    assert config.data_dir == tmp_path
    assert config.listen == DEFAULT_LISTEN and config.bootstrap == () and config.rpc_port == 0
    assert (config.log_format, config.log_level) == ("text", "info")
    assert config.config_file is None


def test_file_then_environment_then_flags(tmp_path):
    write_config(tmp_path, f'rpc_port = 7000\nlog_format = "json"\nlog_level = "debug"\nbootstrap = ["{BOOT_A}"]\n')
    from_file = load_config(data_dir=tmp_path, environ={})
    assert (from_file.rpc_port, from_file.log_format, from_file.log_level) == (7000, "json", "debug")
    assert from_file.bootstrap == (BOOT_A,)
    assert from_file.config_file == tmp_path / "config.toml"

    environ = {
        "LOCOMESH_RPC_PORT": "7001",
        "LOCOMESH_BOOTSTRAP": f"{BOOT_B}, {BOOT_A}",
        "LOCOMESH_LOG_LEVEL": "WARNING",
    }
    from_env = load_config(data_dir=tmp_path, environ=environ)
    assert (from_env.rpc_port, from_env.log_format, from_env.log_level) == (7001, "json", "warning")
    assert from_env.bootstrap == (BOOT_B, BOOT_A)

    flags = {"rpc_port": 7002, "bootstrap": [BOOT_A], "listen": None, "log_format": None}
    from_flags = load_config(data_dir=tmp_path, environ=environ, flags=flags)
    assert (from_flags.rpc_port, from_flags.log_format, from_flags.bootstrap) == (7002, "json", (BOOT_A,))
    assert from_flags.listen == DEFAULT_LISTEN


def test_data_dir_and_config_file_from_the_environment(tmp_path):
    other = write_config(tmp_path / "elsewhere", "rpc_port = 9\n")
    config = load_config(environ={"LOCOMESH_DATA_DIR": str(tmp_path / "dd"), "LOCOMESH_CONFIG": str(other)})
    assert config.data_dir == tmp_path / "dd" and config.rpc_port == 9
    assert load_config(data_dir=tmp_path / "flag", environ={"LOCOMESH_DATA_DIR": "/nope"}).data_dir == tmp_path / "flag"


@pytest.mark.parametrize(
    "text, message",
    [
        ("rpc_port = 70000\n", "rpc_port"),
        ('rpc_port = "80"\n', "expected an integer"),
        ("rpc_port = true\n", "expected an integer"),
        ('listen = "/ip4/1.2.3.4/tcp/1"\n', "expected a list"),
        ('listen = ["/ip4/1.2.3.4/udp/1"]\n', "not a TCP address"),
        ('listen = ["not a multiaddr"]\n', "not a multiaddr"),
        ("listen = []\n", "at least one"),
        ('bootstrap = ["/ip4/1.2.3.4/tcp/1"]\n', "lacks the peer ID"),
        ('log_format = "xml"\n', "log_format"),
        ('lsiten = ["/ip4/1.2.3.4/tcp/1"]\n', "unknown key 'lsiten'"),
        ("rpc_port = = 3\n", "not valid TOML"),
        ('device = "gpu"\n', "device: 'gpu' is not a device"),
        ('device = "cuda:x"\n', "device"),
        ("device = 0\n", "expected a string"),
        ("local_workers = -1\n", "local_workers"),
        ('local_workers = "2"\n', "expected an integer"),
    ],
)
def test_bad_file_values_are_config_errors(tmp_path, text, message):
    write_config(tmp_path, text)
    with pytest.raises(ConfigError, match=message) as caught:
        load_config(data_dir=tmp_path, environ={})
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "environ, message",
    [
        ({"LOCOMESH_RPC_PORT": "eighty"}, "LOCOMESH_RPC_PORT"),
        ({"LOCOMESH_LOG_LEVEL": "loud"}, "log_level"),
        ({"LOCOMESH_CONFIG": "/does/not/exist.toml"}, "does not exist"),
        ({"LOCOMESH_DEVICE": "tpu"}, "device"),
        ({"LOCOMESH_LOCAL_WORKERS": "two"}, "LOCOMESH_LOCAL_WORKERS"),
    ],
)
def test_bad_environment_values_are_config_errors(tmp_path, environ, message):
    with pytest.raises(ConfigError, match=message):
        load_config(data_dir=tmp_path, environ=environ)


def test_bad_flag_values_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="rpc_port"):
        load_config(data_dir=tmp_path, environ={}, flags={"rpc_port": -1})


def test_device_and_local_workers_at_every_level(tmp_path):
    from locomesh.cli.main import build_parser

    default = load_config(data_dir=tmp_path, environ={})
    assert (default.device, default.local_workers) == ("auto", 0)
    write_config(tmp_path, 'device = "cuda:1"\nlocal_workers = 1\n')
    from_file = load_config(data_dir=tmp_path, environ={})
    assert (from_file.device, from_file.local_workers) == ("cuda:1", 1)
    environ = {"LOCOMESH_DEVICE": "CUDA", "LOCOMESH_LOCAL_WORKERS": "2"}
    from_env = load_config(data_dir=tmp_path, environ=environ)
    assert (from_env.device, from_env.local_workers) == ("cuda", 2)
    args = build_parser().parse_args(["node", "start", "--device", "cpu", "--local-workers", "4"])
    from_flags = load_config(data_dir=tmp_path, environ=environ, flags={"device": args.device,
                                                                        "local_workers": args.local_workers})
    assert (from_flags.device, from_flags.local_workers) == ("cpu", 4)
    with pytest.raises(ConfigError, match="local_workers"):
        load_config(data_dir=tmp_path, environ={}, flags={"local_workers": True})


def test_the_device_is_checked_without_torch(tmp_path):
    """The daemon loads torch on its first join only: the config checks a device's syntax alone
    (whether the machine has it is for the join to say)."""
    import subprocess
    import sys

    code = ("import sys; from locomesh.node.config import load_config; "
            f"config = load_config(data_dir={str(tmp_path)!r}, environ={{}}, flags={{'device': 'cuda:7'}}); "
            "assert config.device == 'cuda:7'; assert 'torch' not in sys.modules, 'torch was imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_unknown_locomesh_variables_are_named_with_the_closest_setting():
    from locomesh.node.config import unknown_variables

    environ = {"LOCOMESH_RELAY": "on", "LOCOMESH_DATA_DIR": "/x", "LOCOMESH_BOOTSTAP": "a", "LOCOMESH_ZZZ": "1", "PATH": "/bin"}
    warnings = unknown_variables(environ)
    assert len(warnings) == 2
    assert warnings[0].startswith("environment variable LOCOMESH_BOOTSTAP is not a locomesh setting")
    assert "did you mean LOCOMESH_BOOTSTRAP?" in warnings[0]
    assert "LOCOMESH_ZZZ" in warnings[1] and "known: LOCOMESH_LISTEN" in warnings[1]

