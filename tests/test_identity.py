"""What identifies hardware: UUID and GUID parsers, DMI and RDMA identity read from recorded sysfs trees."""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuaccept.checks.env import identity_info
from gpuaccept.errors import InputError
from gpuaccept.hw.identity import (
    ABSENT,
    DMI_FIELDS,
    UNREADABLE,
    guid_of_gid,
    node_hw_id,
    normalize_gpu_uuid,
    normalize_guid,
    plausible_serial,
    read_nic_identities,
    read_node_identity,
)
from gpuaccept.hw.rdma import read_inventory
from tests.unprivileged import Account, account_python

DATA = Path(__file__).resolve().parent / "data"
DMI = DATA / "dmi"
SYSFS = DATA / "sysfs"


@pytest.mark.parametrize(("text", "canonical"), [
    ("GPU-3f1c2a4e-8b7d-4c21-9e0a-5d6f7a8b9c00", "GPU-3f1c2a4e-8b7d-4c21-9e0a-5d6f7a8b9c00"),
    ("  gpu-3F1C2A4E-8B7D-4C21-9E0A-5D6F7A8B9C00\n", "GPU-3f1c2a4e-8b7d-4c21-9e0a-5d6f7a8b9c00"),
    ("3f1c2a4e-8b7d-4c21-9e0a-5d6f7a8b9c00", "GPU-3f1c2a4e-8b7d-4c21-9e0a-5d6f7a8b9c00"),
])
def test_gpu_uuid_forms(text: str, canonical: str) -> None:
    assert normalize_gpu_uuid(text) == canonical


@pytest.mark.parametrize("text", [
    "", "GPU-", "GPU-3f1c2a4e", "GPU-3f1c2a4e-8b7d-4c21-9e0a-5d6f7a8b9c0", "GPU-3f1c2a4e-8b7d-4c21-9e0a-5d6f7a8b9c00x",
    "MIG-3f1c2a4e-8b7d-4c21-9e0a-5d6f7a8b9c00", "GPU-3g1c2a4e-8b7d-4c21-9e0a-5d6f7a8b9c00", "cuda:0", "0"])
def test_malformed_gpu_uuids_are_refused(text: str) -> None:
    with pytest.raises(InputError, match="is not a GPU UUID: expected GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"):
        normalize_gpu_uuid(text)


def test_guid_forms() -> None:
    for text in ("0xb8599f0300d4a7f6", "b8599f0300d4a7f6", "B859:9F03:00D4:A7F6", " 0XB8599F0300D4A7F6 "):
        assert normalize_guid(text) == "0xb8599f0300d4a7f6"
    for bad in ("", "0x0000000000000000", "0000:0000:0000:0000", "0xb8599f0300d4a7f", "b859:9f03:00d4",
                "mlx5_0:1", "0xb8599f0300d4a7f6a"):
        with pytest.raises(InputError, match="is not a port GUID"):
            normalize_guid(bad)
    assert guid_of_gid("fe80:0000:0000:0000:b859:9f03:00d4:a7f6\n") == "0xb8599f0300d4a7f6"
    assert guid_of_gid("0000:0000:0000:0000:0000:0000:0000:0000") is None  # no GID assigned
    assert guid_of_gid("fe80::b859:9f03:00d4:a7f6") is None  # not the kernel's form


def test_serial_placeholders_name_nothing() -> None:
    assert plausible_serial(" OM234S600412\n") == "OM234S600412"
    for placeholder in ("To be filled by O.E.M.", "Default string", "0123456789", "0000000", "", "Not Specified",
                        UNREADABLE, ABSENT, "unsupported", None, 12):
        assert plausible_serial(placeholder) is None, placeholder
    assert node_hw_id({"board_serial": "Default string", "product_serial": "S938432X3A17254"}) == \
        ("S938432X3A17254", "S938432X3A17254")
    assert node_hw_id({"board_serial": "OM234S600412", "product_serial": UNREADABLE}) == ("OM234S600412", None)
    assert node_hw_id({}) == (None, None)


def test_node_identity_from_a_recorded_tree() -> None:
    ident = read_node_identity(DMI / "supermicro_h100")
    assert ident == {"sys_vendor": "Supermicro", "product_name": "SYS-821GE-TNHR",
                     "product_serial": "S938432X3A17254", "board_vendor": "Supermicro", "board_name": "X13DEG-OAD",
                     "board_serial": "OM234S600412"}
    assert node_hw_id(ident) == ("OM234S600412", "S938432X3A17254")
    oem = read_node_identity(DMI / "oem_placeholders")
    assert oem["board_name"] == "GENOAD8X-2T/BCM" and node_hw_id(oem) == (None, None)
    assert read_node_identity(SYSFS / "no_rdma") == dict.fromkeys(DMI_FIELDS, ABSENT)  # no DMI at all


def _root_only_copy(base: Path) -> Path:
    """The Supermicro tree with the serials as the kernel has them: mode 0400, owned by root (us, if not root);
    every directory open to all (pytest's own temporary directories are not)."""
    tree = base / "node"
    shutil.copytree(DMI / "supermicro_h100", tree)
    for d in (base, tree, tree / "sys", tree / "sys/class", tree / "sys/class/dmi", tree / "sys/class/dmi/id"):
        d.chmod(0o755)
    for f in (tree / "sys/class/dmi/id").iterdir():
        f.chmod(0o400 if f.name.endswith("_serial") else 0o444)
    return tree


@pytest.fixture
def open_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="gpuaccept-dmi-"))
    yield path
    shutil.rmtree(path)


def test_root_only_serials_read_as_unreadable_by_an_ordinary_user(open_dir: Path) -> None:
    tree = _root_only_copy(open_dir)
    if os.geteuid() != 0:
        for f in (tree / "sys/class/dmi/id").glob("*_serial"):
            f.chmod(0)  # without root, the owner too is refused once the mode is 0
        ident = read_node_identity(tree)
    else:
        nobody = Account("nobody", 65534, 65534, open_dir)
        python, extra = account_python(nobody)
        code = ("import json, sys; from gpuaccept.hw.identity import read_node_identity; "
                "print(json.dumps(read_node_identity(sys.argv[1])))")
        proc = nobody.run([*python, "-c", code, str(tree)], **extra)
        assert proc.returncode == 0, proc.stderr
        ident = json.loads(proc.stdout)
        assert read_node_identity(tree)["board_serial"] == "OM234S600412"  # root reads it
        assert stat.S_IMODE((tree / "sys/class/dmi/id/board_serial").stat().st_mode) == 0o400
    assert ident["board_serial"] == UNREADABLE and ident["product_serial"] == UNREADABLE
    assert ident["product_name"] == "SYS-821GE-TNHR" and ident["board_name"] == "X13DEG-OAD"
    assert node_hw_id(ident) == (None, None)


def test_nic_identities_from_recorded_trees() -> None:
    nics = read_nic_identities(SYSFS / "ndr_4x")
    assert [n["port"] for n in nics] == ["mlx5_0:1", "mlx5_1:1", "mlx5_2:1", "mlx5_3:1"]
    assert nics[0] == {"port": "mlx5_0:1", "guid": "0xb8599f03000ca7f6", "node_guid": "0xb8599f03000ca7f6"}
    assert len({n["guid"] for n in nics}) == 4
    roce = read_nic_identities(SYSFS / "roce_2x")
    assert roce[0]["guid"] == "0xba599ffffe0ca7f6"  # the EUI-64 of the port's MAC
    bad = {n["port"]: n for n in read_nic_identities(SYSFS / "malformed")}
    assert bad["mlx5_1:1"]["guid"] is None and bad["mlx5_1:1"]["node_guid"] == "0xb8599f03001ca7f6"
    assert read_nic_identities(SYSFS / "no_rdma") == []
    # The fabric check's inventory reads the same GUIDs.
    inv = read_inventory(SYSFS / "ndr_4x")
    assert [(p.key, p.guid) for p in inv.ports] == [(n["port"], n["guid"]) for n in nics]
    assert inv.devices[0].node_guid == "0xb8599f03000ca7f6"
    assert inv.devices[0].ports[0].to_dict()["guid"] == "0xb8599f03000ca7f6"


def test_env_identity_on_this_machine() -> None:
    """On a real node: every DMI field is text, "unreadable" or "absent"; never an exception."""
    ident = identity_info()
    assert set(ident["node"]) == set(DMI_FIELDS)
    assert all(isinstance(v, str) for v in ident["node"].values())
    dmi = Path("/sys/class/dmi/id")
    for name, value in ident["node"].items():
        if not (dmi / name).exists():
            assert value == ABSENT
        elif os.access(dmi / name, os.R_OK):
            assert value == (dmi / name).read_text(errors="replace").strip()
    assert ident["nics"] == read_nic_identities("/")
