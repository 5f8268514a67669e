"""Turn operators' CustomResourceDefinitions into the strict JSON schemas tests/unit/test_k8s_manifests.py uses.

Run it when an operator is upgraded (see README.md beside this file for the sources):

    python infra/k8s/crd-schemas/build.py path/to/040-Crd-kafka.yaml path/to/ray.io_rayservices.yaml ...

The storage version of each CRD (the one manifests should use) becomes ``<group>/<kind>_<version>.json``.
Descriptions are dropped (they are most of the bytes and never change what validates); everything else of
``openAPIV3Schema`` is kept. Objects that declare ``properties`` get ``additionalProperties: false`` unless the
CRD marks them ``x-kubernetes-preserve-unknown-fields``, as the API server prunes unknown fields there: a misspelt
key fails.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent


def _strict(node: Any) -> Any:
    if isinstance(node, list):
        return [_strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {k: _strict(v) for k, v in node.items() if k != "description"}
    if node.get("x-kubernetes-int-or-string") and "type" not in node and "anyOf" not in node:
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if "properties" in node and "additionalProperties" not in node and not node.get(
        "x-kubernetes-preserve-unknown-fields"
    ):
        out["additionalProperties"] = False
    return out


def schemas(crd: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``{relative path: JSON schema}`` for the storage version of one CRD."""
    spec = crd["spec"]
    group, kind = spec["group"], spec["names"]["kind"]
    out: dict[str, dict[str, Any]] = {}
    for version in spec["versions"]:
        if not version.get("storage", False):
            continue
        schema = _strict(version["schema"]["openAPIV3Schema"])
        props = schema.setdefault("properties", {})
        props["apiVersion"] = {"const": f"{group}/{version['name']}"}
        props["kind"] = {"const": kind}
        props["metadata"] = {"type": "object"}
        schema["required"] = sorted(set(schema.get("required", [])) | {"apiVersion", "kind", "metadata"})
        schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
        out[f"{group}/{kind.lower()}_{version['name']}.json"] = schema
    return out


def main(paths: list[str]) -> None:
    for path in paths:
        for doc in yaml.safe_load_all(Path(path).read_text(encoding="utf-8")):
            if not doc or doc.get("kind") != "CustomResourceDefinition":
                continue
            for rel, schema in schemas(doc).items():
                target = HERE / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(json.dumps(schema, sort_keys=True, separators=(",", ":")) + "\n", encoding="utf-8")
                print(f"{target.relative_to(HERE)} {target.stat().st_size} bytes")


if __name__ == "__main__":
    main(sys.argv[1:])
