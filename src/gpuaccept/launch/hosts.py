"""Host lists for the ssh (and mpi) launchers: ``--hosts``, ``--hostfile`` and ``~/.ssh/config`` aliases.

Everything here is a pure function of text; callers read the files.

Entries
    ``node1``, ``user@node1``, ``node1:2222``, ``user@[fe80::1%eth0]:2222``.
    IPv6 addresses go in brackets. A name may be an ssh config alias.

Host files
    One entry per line, ``#`` starts a comment, then optional ``key=value``
    fields: ``slots=N`` (processes on that host), ``max_slots=N`` (accepted
    for OpenMPI hostfile compatibility, not used), ``user=U``, ``port=P``,
    ``identity=PATH``::

        # rack 3
        gpu-017 slots=8
        admin@gpu-018:2222 slots=8 identity=~/.ssh/id_rack3

ssh config
    Connections go through ``ssh`` itself, which applies ``~/.ssh/config``
    (or ``--ssh-config FILE`` via ``-F``) with its full semantics: ``Match``,
    ``Include``, ``ProxyJump``, ``ControlMaster``, canonicalisation. Only two
    things are needed before connecting, and :func:`parse_ssh_config` reads
    just enough for them: the concrete aliases to pick hosts from
    (``--ssh-config-hosts 'gpu-*'``), and the ``HostName`` of the first host,
    which the other hosts dial for rendezvous. That parser honours ``Host``
    patterns (``*``, ``?``, ``!``), first-value-wins, ``HostName`` (with
    ``%h``), ``User``, ``Port`` and ``IdentityFile``; it does not evaluate
    ``Match`` blocks or follow ``Include`` (``--master-addr`` overrides when
    that matters).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from gpuaccept.errors import ConfigError

_USER = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]*$")
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]*$")
_V6 = re.compile(r"^[0-9A-Fa-f:.]+(%[A-Za-z0-9._-]+)?$")
_ENTRY = re.compile(r"^(?:(?P<user>[^@]*)@)?(?:\[(?P<v6>[^\]]*)\]|(?P<name>[^:\[\]]*))(?::(?P<port>.*))?$")
_HOSTFILE_KEYS = ("slots", "max_slots", "max-slots", "user", "port", "identity")


@dataclass(frozen=True)
class Host:
    """One host to launch on.

    ``name`` is a host name, an address or an ssh config alias; ``user``,
    ``port`` and ``identity`` (a private key path) are None where ssh's own
    configuration decides; ``slots`` is the number of processes on the host
    (None: the job's processes per node).
    """

    name: str
    user: str | None = None
    port: int | None = None
    slots: int | None = None
    identity: str | None = None

    @property
    def is_ipv6(self) -> bool:
        return ":" in self.name

    def __str__(self) -> str:
        host = f"[{self.name}]" if self.is_ipv6 else self.name
        text = (f"{self.user}@" if self.user else "") + host + (f":{self.port}" if self.port else "")
        return text + (f" slots={self.slots}" if self.slots else "") + (
            f" identity={self.identity}" if self.identity else "")


def _port(text: str, source: str, entry: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise ConfigError(source, entry, f"port must be a number from 1 to 65535, got {text!r}")
    return int(text)


def _count(text: str, source: str, entry: str, key: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise ConfigError(source, entry, f"{key} must be a whole number >= 1, got {text!r}")
    return int(text)


def parse_host(text: str, source: str = "--hosts") -> Host:
    """``[user@]name[:port]`` or ``[user@][v6addr][:port]`` to a Host. Raises ConfigError naming the entry."""
    entry = text.strip()
    if not entry:
        raise ConfigError(source, repr(text), "empty host entry")
    if any(c.isspace() for c in entry) or "\0" in entry:
        raise ConfigError(source, repr(entry), "a host entry cannot contain spaces or control characters")
    if entry.count(":") > 1 and "[" not in entry:
        raise ConfigError(source, entry, "write an IPv6 address in brackets, e.g. [::1] or user@[::1]:2222")
    m = _ENTRY.match(entry)
    if m is None:
        raise ConfigError(source, entry, "expected [user@]host[:port]")
    user, v6, name, port = m.group("user"), m.group("v6"), m.group("name"), m.group("port")
    if user is not None and not _USER.match(user):
        raise ConfigError(source, entry, f"bad user name {user!r} (letters, digits, . _ -; not starting with -)")
    if v6 is not None:
        if not _V6.match(v6) or ":" not in v6:
            raise ConfigError(source, entry, f"{v6!r} is not an IPv6 address")
        host = v6
    else:
        if not name:
            raise ConfigError(source, entry, "the host name is empty")
        if not _NAME.match(name):
            raise ConfigError(source, entry, f"bad host name {name!r} (letters, digits, . _ -; not starting with -)")
        host = name
    return Host(name=host, user=user, port=_port(port, source, entry) if port is not None else None)


def parse_host_list(text: str, source: str = "--hosts") -> list[Host]:
    """``"a,b,user@c:2222"`` (separated by commas or line breaks) to Hosts; empty pieces are ignored.

    Blanks around a host are dropped, but a blank inside one item (``"host name"``) is refused,
    not read as two hosts: a host name has no blanks.
    """
    hosts = []
    for piece in re.split(r"[,\r\n]+", text):
        piece = piece.strip()
        if not piece:
            continue
        if re.search(r"\s", piece):
            raise ConfigError(source, repr(piece), "a host name cannot contain blanks; separate hosts with commas")
        hosts.append(parse_host(piece, source))
    if not hosts:
        raise ConfigError(source, repr(text), "no hosts given")
    return hosts


def parse_hostfile(text: str, source: str = "hostfile") -> list[Host]:
    """A host file (see the module docstring). Errors name ``source:LINE``."""
    hosts: list[Host] = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{source}:{lineno}"
        first, *fields = line.split()
        host = parse_host(first, where)
        for item in fields:
            key, sep, value = item.partition("=")
            if not sep or key not in _HOSTFILE_KEYS:
                raise ConfigError(where, item, f"expected key=value with key one of {', '.join(_HOSTFILE_KEYS)}")
            if not value:
                raise ConfigError(where, item, f"{key} has no value")
            if key == "slots":
                host = replace(host, slots=_count(value, where, item, key))
            elif key in ("max_slots", "max-slots"):
                _count(value, where, item, key)
            elif key == "user":
                if host.user is not None and host.user != value:
                    raise ConfigError(where, item, f"user given twice ({host.user!r} and {value!r})")
                if not _USER.match(value):
                    raise ConfigError(where, item, f"bad user name {value!r}")
                host = replace(host, user=value)
            elif key == "port":
                port = _port(value, where, item)
                if host.port is not None and host.port != port:
                    raise ConfigError(where, item, f"port given twice ({host.port} and {port})")
                host = replace(host, port=port)
            else:
                host = replace(host, identity=value)
        hosts.append(host)
    if not hosts:
        raise ConfigError(source, "", "the host file lists no hosts")
    return hosts


def check_unique(hosts: list[Host], source: str = "hosts") -> None:
    """Reject the same destination listed twice (same user, name and port)."""
    seen: set[tuple[str | None, str, int | None]] = set()
    for h in hosts:
        key = (h.user, h.name.lower(), h.port)
        if key in seen:
            raise ConfigError(source, str(h).split()[0], "listed twice; each host runs one node of the job")
        seen.add(key)


def host_labels(hosts: list[Host]) -> list[str]:
    """A unique, stable name per host: the host name, with ``-PORT``/user added only to tell entries apart.

    Reports are attributed to these labels (``GPUACCEPT_HOSTNAME``) and
    their files land in directories named after them.
    """
    check_unique(hosts)
    counts: dict[str, int] = {}
    for h in hosts:
        counts[h.name.lower()] = counts.get(h.name.lower(), 0) + 1
    labels = []
    for h in hosts:
        if counts[h.name.lower()] == 1:
            labels.append(h.name)
        else:
            labels.append("-".join(p for p in (h.user, h.name, str(h.port or 22)) if p))
    if len(set(labels)) != len(labels):
        dup = next(lb for lb in labels if labels.count(lb) > 1)
        raise ConfigError("hosts", dup, "two entries reach the same host and port; list it once")
    return labels


def safe_dirname(label: str) -> str:
    """A file-system-safe directory name for a host label (``::1`` -> ``__1``)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", label)


# ---------------------------------------------------------------- ssh config


@dataclass(frozen=True)
class SshConfigBlock:
    """One ``Host`` block (``match`` True for a ``Match`` block, which is never applied here).

    ``options`` are ``(keyword in lower case, value)`` in file order.
    """

    patterns: tuple[str, ...]
    options: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    match: bool = False


@dataclass(frozen=True)
class SshTarget:
    """What the ssh config says about one alias (None: not set)."""

    alias: str
    hostname: str
    user: str | None = None
    port: int | None = None
    identity_files: tuple[str, ...] = ()


_KV = re.compile(r"^(?P<key>[A-Za-z][A-Za-z0-9]*)(?:\s*=\s*|\s+)(?P<value>.*)$")


def _unquote(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1]
    return value


def _split_args(value: str) -> list[str]:
    """Whitespace-separated words, double quotes grouping (as ssh's argv_split)."""
    return [a or b for a, b in re.findall(r'"([^"]*)"|(\S+)', value)]


def parse_ssh_config(text: str, source: str = "ssh config") -> list[SshConfigBlock]:
    """``ssh_config`` text to blocks. Options before the first ``Host`` form a ``Host *`` block.

    Raises ConfigError for a ``Port`` that is not a number, a ``Host`` line
    without patterns, or a line that is not ``Keyword value``.
    """
    blocks: list[SshConfigBlock] = []
    patterns: tuple[str, ...] = ("*",)
    is_match = False
    options: list[tuple[str, str]] = []

    def close() -> None:
        if options or patterns != ("*",) or is_match:
            blocks.append(SshConfigBlock(patterns, tuple(options), is_match))

    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _KV.match(line)
        where = f"{source}:{lineno}"
        if m is None:
            raise ConfigError(where, line, "expected 'Keyword value'")
        key, value = m.group("key").lower(), m.group("value").strip()
        if key in ("host", "match"):
            close()
            options = []
            is_match = key == "match"
            patterns = () if is_match else tuple(_split_args(value))
            if not is_match and not patterns:
                raise ConfigError(where, line, "Host needs at least one pattern")
            continue
        if key == "port" and not (_unquote(value).isdigit() and 1 <= int(_unquote(value)) <= 65535):
            raise ConfigError(where, line, "Port must be a number from 1 to 65535")
        options.append((key, _unquote(value)))
    close()
    return blocks


def _pattern_matches(pattern: str, name: str) -> bool:
    rx = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(rx, name, flags=re.IGNORECASE) is not None


def block_applies(block: SshConfigBlock, name: str) -> bool:
    """ssh's Host rule: some pattern matches and no negated (``!``) pattern does."""
    if block.match:
        return False
    hit = False
    for p in block.patterns:
        if p.startswith("!"):
            if _pattern_matches(p[1:], name):
                return False
        elif _pattern_matches(p, name):
            hit = True
    return hit


def resolve_alias(blocks: list[SshConfigBlock], alias: str) -> SshTarget:
    """HostName, User, Port and IdentityFile for ``alias``: first value wins; IdentityFiles add up."""
    found: dict[str, str] = {}
    identities: list[str] = []
    for block in blocks:
        if not block_applies(block, alias):
            continue
        for key, value in block.options:
            if key == "identityfile":
                identities.append(value)
            elif key in ("hostname", "user", "port") and key not in found:
                found[key] = value
    hostname = found.get("hostname", alias)
    hostname = re.sub(r"%(.)", lambda m: alias if m.group(1) == "h" else "%" if m.group(1) == "%" else m.group(0),
                      hostname)
    return SshTarget(alias=alias, hostname=hostname, user=found.get("user"),
                     port=int(found["port"]) if "port" in found else None, identity_files=tuple(identities))


def config_aliases(blocks: list[SshConfigBlock]) -> list[str]:
    """Concrete ``Host`` names (no wildcard, no negation), in file order, each once."""
    out: list[str] = []
    for block in blocks:
        for p in block.patterns:
            if not any(c in p for c in "*?!") and p not in out:
                out.append(p)
    return out


def select_aliases(blocks: list[SshConfigBlock], pattern: str, source: str = "--ssh-config-hosts") -> list[Host]:
    """Hosts for the concrete aliases matching ``pattern`` (``*``/``?`` glob, or several comma-separated)."""
    wanted = [p for p in re.split(r"[,\s]+", pattern) if p]
    if not wanted:
        raise ConfigError(source, repr(pattern), "empty pattern")
    hosts: list[Host] = []
    for alias in config_aliases(blocks):
        if any(_pattern_matches(p, alias) for p in wanted):
            if not _NAME.match(alias):
                raise ConfigError(source, alias, "this alias has characters a host label cannot hold")
            hosts.append(Host(name=alias))
    if not hosts:
        known = ", ".join(config_aliases(blocks)) or "none"
        raise ConfigError(source, pattern, f"no Host alias in the ssh config matches (aliases: {known})")
    return hosts
