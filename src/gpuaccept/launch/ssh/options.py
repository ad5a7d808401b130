"""Options of the ssh backend (``spec.options``), validated: hosts, connection, remote side, rendezvous."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpuaccept.errors import ConfigError
from gpuaccept.launch.hosts import Host, check_unique, parse_hostfile

DEFAULT_REMOTE_DIR = "/tmp/gpuaccept"
DEFAULT_MAX_CONNECTIONS = 32
DEFAULT_CONNECT_TIMEOUT_S = 10

_SAFE_PATH = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._/+=@,-"
_FLAGS = {
    "hosts": "--hosts", "ssh_config": "--ssh-config", "user": "--user", "port": "--port", "identity": "--identity",
    "ssh_options": "--ssh-option", "connect_timeout_s": "--connect-timeout", "max_connections": "--max-connections",
    "remote_python": "--remote-python", "remote_dir": "--remote-dir", "rendezvous": "--rendezvous",
    "master_addr": "--master-addr", "master_port": "--master-port", "fail_fast": "--fail-fast",
}
"""Option key -> the flag that sets it (error messages name the flag)."""
_OPTION_KEYS = frozenset(_FLAGS)


@dataclass(frozen=True)
class SshOptions:
    """Validated ssh backend options (``spec.options``).

    ``user``/``port``/``identity`` apply to hosts that do not set their own;
    ``connect_timeout_s`` is in seconds; ``remote_python`` None means
    ``spec.python``; ``fail_fast`` None means on for distributed jobs.
    """

    hosts: tuple[Host, ...]
    ssh_config: str | None = None
    user: str | None = None
    port: int | None = None
    identity: str | None = None
    ssh_options: tuple[str, ...] = ()
    connect_timeout_s: int = DEFAULT_CONNECT_TIMEOUT_S
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    remote_python: str | None = None
    remote_dir: str = DEFAULT_REMOTE_DIR
    rendezvous: str = "static"
    master_addr: str | None = None
    master_port: int | None = None
    fail_fast: bool | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "ssh options") -> SshOptions:
        """Validate a dict from flags or YAML; hosts may be Host objects or host-file lines."""
        unknown = sorted(set(d) - _OPTION_KEYS)
        if unknown:
            raise ConfigError(source, unknown[0], f"unknown ssh option; known: {', '.join(sorted(_OPTION_KEYS))}")
        raw_hosts = d.get("hosts") or []
        if isinstance(raw_hosts, str):
            raw_hosts = [raw_hosts]
        hosts: list[Host] = []
        for item in raw_hosts:
            if isinstance(item, Host):
                hosts.append(item)
            elif isinstance(item, str):
                hosts.extend(parse_hostfile(item, f"{source}: hosts"))
            else:
                raise ConfigError("--hosts", repr(item), "expected host entries (strings)")
        if not hosts:
            raise ConfigError(source, "", "no hosts: give --hosts, --hostfile or --ssh-config-hosts")
        check_unique(hosts, "--hosts")

        def integer(key: str, low: int, high: int, default: int | None) -> int | None:
            value = d.get(key, default)
            if value is None:
                return None
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ConfigError(_FLAGS[key], repr(value), f"must be a whole number from {low} to {high}")
            return value

        def text(key: str, default: str | None = None) -> str | None:
            value = d.get(key, default)
            if value is None:
                return None
            if not isinstance(value, str) or not value or any(c in value for c in "\0\n\r"):
                raise ConfigError(_FLAGS[key], repr(value), "must be a non-empty single-line string")
            return value

        ssh_options = d.get("ssh_options") or ()
        if isinstance(ssh_options, str) or not all(isinstance(o, str) for o in ssh_options):
            raise ConfigError(_FLAGS["ssh_options"], repr(ssh_options), "must be a list of KEY=VALUE strings")
        for opt in ssh_options:
            key, sep, value = opt.partition("=")
            if not sep or not key.isalnum() or not value or any(c in value for c in "\0\n\r"):
                raise ConfigError("--ssh-option", opt,
                                  "expected KEY=VALUE, as ssh -o takes it (e.g. ProxyJump=bastion)")
        remote_dir = text("remote_dir", DEFAULT_REMOTE_DIR) or DEFAULT_REMOTE_DIR
        body = remote_dir[2:] if remote_dir.startswith("~/") else remote_dir
        if not remote_dir.startswith(("/", "~/")) or any(c not in _SAFE_PATH for c in body):
            raise ConfigError("--remote-dir", remote_dir,
                              "must be absolute or start with ~/, and use letters, digits and . _ / + = @ , - only "
                              "(scp reads remote paths through a shell or a glob, depending on the OpenSSH version)")
        rendezvous = d.get("rendezvous", "static")
        if rendezvous not in ("static", "c10d"):
            raise ConfigError("--rendezvous", str(rendezvous), "must be static or c10d")
        fail_fast = d.get("fail_fast")
        if fail_fast is not None and not isinstance(fail_fast, bool):
            raise ConfigError(_FLAGS["fail_fast"], repr(fail_fast), "must be true or false")
        user = text("user")
        if user is not None and (user.startswith("-") or any(c.isspace() for c in user)):
            raise ConfigError("--user", user, "not a user name")
        return cls(
            hosts=tuple(hosts),
            ssh_config=text("ssh_config"),
            user=user,
            port=integer("port", 1, 65535, None),
            identity=text("identity"),
            ssh_options=tuple(ssh_options),
            connect_timeout_s=integer("connect_timeout_s", 1, 3600, DEFAULT_CONNECT_TIMEOUT_S)
            or DEFAULT_CONNECT_TIMEOUT_S,
            max_connections=integer("max_connections", 1, 100000, DEFAULT_MAX_CONNECTIONS)
            or DEFAULT_MAX_CONNECTIONS,
            remote_python=text("remote_python"),
            remote_dir=remote_dir,
            rendezvous=str(rendezvous),
            master_addr=text("master_addr"),
            master_port=integer("master_port", 1, 65535, None),
            fail_fast=fail_fast,
        )
