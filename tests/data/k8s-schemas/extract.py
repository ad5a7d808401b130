"""Extract the served version's openAPIV3Schema from CRD files into compact JSON (descriptions dropped).

Usage: python tests/data/k8s-schemas/extract.py [CRD_DIR]   (default: ../shared/k8s-crds next to the repo)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
CRDS = {
    "jobset.x-k8s.io_jobsets.yaml": "jobset.x-k8s.io_v1alpha2_JobSet.json",
    "kubeflow.org_pytorchjobs.yaml": "kubeflow.org_v1_PyTorchJob.json",
    "kubeflow.org_mpijobs.yaml": "kubeflow.org_v2beta1_MPIJob.json",
    "trainer.kubeflow.org_trainjobs.yaml": "trainer.kubeflow.org_v1alpha1_TrainJob.json",
}
_SCHEMA_MAPS = ("properties", "patternProperties", "definitions", "$defs")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf")
_SCHEMA_ONE = ("items", "additionalProperties", "not")


def strip(node: Any) -> Any:
    """Drop ``description`` keywords, but never a property that happens to be named description."""
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "description":
            continue
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {k: strip(v) for k, v in value.items()}
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            out[key] = [strip(v) for v in value]
        elif key in _SCHEMA_ONE:
            out[key] = strip(value)
        else:
            out[key] = value
    return out


def main(crd_dir: Path) -> None:
    for src, dst in CRDS.items():
        crd = next(d for d in yaml.safe_load_all((crd_dir / src).read_text()) if d)
        served = [v for v in crd["spec"]["versions"] if v.get("served")]
        version = next(v for v in served if v["name"] in dst)
        schema = strip(version["schema"]["openAPIV3Schema"])
        (HERE / dst).write_text(json.dumps(schema, sort_keys=True, separators=(",", ":")) + "\n")
        print(f"{src} {version['name']} -> {dst}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE.parents[3] / "shared" / "k8s-crds")
