"""Host lists: ``--hosts``, host files and ssh config aliases (pure parsers)."""

from __future__ import annotations

import pytest

from gpuaccept.errors import ConfigError
from gpuaccept.launch.hosts import (
    Host,
    check_unique,
    config_aliases,
    host_labels,
    parse_host,
    parse_host_list,
    parse_hostfile,
    parse_ssh_config,
    resolve_alias,
    safe_dirname,
    select_aliases,
)


@pytest.mark.parametrize(("text", "expected"), [
    ("node1", Host("node1")),
    ("admin@node1", Host("node1", user="admin")),
    ("node1:2222", Host("node1", port=2222)),
    ("admin@gpu-17.rack3.example.com:22", Host("gpu-17.rack3.example.com", user="admin", port=22)),
    ("10.0.0.7", Host("10.0.0.7")),
    ("[::1]", Host("::1")),
    ("ops@[fe80::1%eth0]:2200", Host("fe80::1%eth0", user="ops", port=2200)),
    ("  node_2  ", Host("node_2")),
])
def test_parse_host(text: str, expected: Host) -> None:
    assert parse_host(text) == expected


@pytest.mark.parametrize(("text", "why"), [
    ("", "empty host entry"),
    ("node1:", "port must be a number"),
    ("node1:0", "port must be a number from 1 to 65535"),
    ("node1:65536", "port must be a number"),
    ("node1:ssh", "port must be a number"),
    ("@node1", "bad user name ''"),
    ("-oProxyCommand=x", "bad host name"),
    ("bad-user@-node", "bad host name"),
    ("-me@node", "bad user name"),
    ("a@b@c", "bad host name"),
    ("::1", "write an IPv6 address in brackets"),
    ("[nothex]", "is not an IPv6 address"),
    ("node 1", "cannot contain spaces"),
    ("node;rm", "bad host name"),
    ("user@:22", "the host name is empty"),
])
def test_parse_host_rejects(text: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why) as info:
        parse_host(text, "--hosts")
    assert str(info.value).startswith("--hosts: ")


def test_host_list_commas_and_spaces() -> None:
    hosts = parse_host_list("a,b, user@c:2222 ,,d")
    assert hosts == [Host("a"), Host("b"), Host("c", user="user", port=2222), Host("d")]
    with pytest.raises(ConfigError, match="no hosts given"):
        parse_host_list(" , ")


def test_host_str_round_trips_through_the_hostfile_parser() -> None:
    for h in (Host("a"), Host("b", "u", 2222, 4, "/keys/id"), Host("::1", port=22), Host("c", slots=8)):
        assert parse_hostfile(str(h)) == [h]


HOSTFILE = """\
# rack 3, GPU nodes
gpu-017 slots=8
admin@gpu-018:2222 slots=8 identity=~/.ssh/id_rack3   # the odd one
gpu-019 max_slots=8 user=ops port=2200

[fd00::19]
"""


def test_hostfile() -> None:
    assert parse_hostfile(HOSTFILE, "hosts.txt") == [
        Host("gpu-017", slots=8),
        Host("gpu-018", user="admin", port=2222, slots=8, identity="~/.ssh/id_rack3"),
        Host("gpu-019", user="ops", port=2200),
        Host("fd00::19"),
    ]


@pytest.mark.parametrize(("text", "where", "why"), [
    ("a\nb slots=0\n", "hosts.txt:2", "slots must be a whole number >= 1"),
    ("a\n\nb cpus=4\n", "hosts.txt:3", "expected key=value with key one of slots"),
    ("a slots\n", "hosts.txt:1", "expected key=value"),
    ("a slots=\n", "hosts.txt:1", "slots has no value"),
    ("u@a user=v\n", "hosts.txt:1", "user given twice"),
    ("a:22 port=23\n", "hosts.txt:1", "port given twice"),
    ("a port=99999\n", "hosts.txt:1", "port must be a number"),
    ("a user=-x\n", "hosts.txt:1", "bad user name"),
    ("# nothing\n\n", "hosts.txt", "lists no hosts"),
    ("ok\n-bad\n", "hosts.txt:2", "bad host name"),
])
def test_hostfile_errors_name_the_line(text: str, where: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why) as info:
        parse_hostfile(text, "hosts.txt")
    assert str(info.value).startswith(where + ":")


def test_duplicates_and_labels() -> None:
    with pytest.raises(ConfigError, match="listed twice"):
        check_unique([Host("a"), Host("b"), Host("A")])
    assert host_labels([Host("a"), Host("b")]) == ["a", "b"]
    # one box reached on two ports (containers with mapped sshd ports): labels tell them apart
    assert host_labels([Host("box", port=2201), Host("box", port=2202), Host("c")]) == ["box-2201", "box-2202", "c"]
    assert host_labels([Host("box", user="x"), Host("box", user="y")]) == ["x-box-22", "y-box-22"]
    with pytest.raises(ConfigError, match="same host and port"):
        host_labels([Host("box"), Host("box", port=22)])


def test_safe_dirname() -> None:
    assert safe_dirname("gpu-017.example") == "gpu-017.example"
    assert safe_dirname("fe80::1%eth0") == "fe80__1_eth0"


SSH_CONFIG = """\
# global defaults before any Host
ServerAliveInterval 30

Host bastion
    HostName bastion.example.com
    User jump

Host gpu-01 gpu-02
    HostName %h.cluster.internal
    Port 2222
Host gpu-03
  HostName=10.1.0.3
  IdentityFile "~/.ssh/id gpu"
Host gpu-* !gpu-03
    User trainer
    Port 22
    IdentityFile ~/.ssh/id_cluster
Host *
    User fallback
    IdentityFile ~/.ssh/id_default
Match host gpu-02 exec "false"
    User never
"""


def test_ssh_config_first_value_wins() -> None:
    blocks = parse_ssh_config(SSH_CONFIG, "config")
    assert resolve_alias(blocks, "gpu-01").hostname == "gpu-01.cluster.internal"
    t1 = resolve_alias(blocks, "gpu-01")
    assert (t1.user, t1.port, t1.identity_files) == ("trainer", 2222, ("~/.ssh/id_cluster", "~/.ssh/id_default"))
    t3 = resolve_alias(blocks, "GPU-03")  # Host patterns match case-insensitively
    assert (t3.hostname, t3.user, t3.port) == ("10.1.0.3", "fallback", None)
    assert t3.identity_files == ("~/.ssh/id gpu", "~/.ssh/id_default")
    unknown = resolve_alias(blocks, "elsewhere")
    assert (unknown.hostname, unknown.user) == ("elsewhere", "fallback")


def test_ssh_config_aliases_and_selection() -> None:
    blocks = parse_ssh_config(SSH_CONFIG, "config")
    assert config_aliases(blocks) == ["bastion", "gpu-01", "gpu-02", "gpu-03"]
    assert select_aliases(blocks, "gpu-*") == [Host("gpu-01"), Host("gpu-02"), Host("gpu-03")]
    with pytest.raises(ConfigError, match="no Host alias"):
        select_aliases(blocks, "gpu-0[1]")  # ssh patterns know * and ? only; brackets are literal
    assert select_aliases(blocks, "bastion,gpu-02") == [Host("bastion"), Host("gpu-02")]
    with pytest.raises(ConfigError, match=r"no Host alias .* matches \(aliases: bastion, gpu-01"):
        select_aliases(blocks, "cpu-*")


@pytest.mark.parametrize(("text", "why"), [
    ("Host a\n  Port twenty\n", "config:2: .*Port must be a number"),
    ("Host\n", "config:1: .*expected 'Keyword value'"),
    ("Host a\n  = b\n", "config:2: .*expected 'Keyword value'"),
])
def test_ssh_config_errors(text: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        parse_ssh_config(text, "config")
