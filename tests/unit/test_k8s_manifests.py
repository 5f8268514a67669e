"""Every manifest in infra/k8s validates offline, as a cluster's API server would check its shape.

Kubernetes' own kinds are checked by ``kubernetes-validate`` (its schemas ship in the package) in strict mode.
Custom resources (Strimzi Kafka/KafkaNodePool/KafkaTopic/KafkaUser, KubeRay RayService, prometheus-operator
ServiceMonitor) are checked against JSON schemas made from those projects' CRDs, kept in ``infra/k8s/crd-schemas``
(its README names the sources) or where ``$FEDFRAUD_K8S_SCHEMAS`` points; strict as well: an unknown field fails.
The Serve configs are also checked by Ray's own ``ServeDeploySchema`` and by the app's typed arguments. No cluster
is run: see docs/deploy.md.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = sorted((ROOT / "infra" / "k8s").glob("*.yaml"))
SERVE_CONFIG = ROOT / "infra" / "serve_config.yaml"
CRD_SCHEMAS = Path(os.environ.get("FEDFRAUD_K8S_SCHEMAS", ROOT / "infra" / "k8s" / "crd-schemas"))
CRD_GROUPS = {"kafka.strimzi.io", "ray.io", "monitoring.coreos.com"}
K8S_VERSION = "1.33"
INSTALLERS = ("pip install", "pip3 install", "uv pip", "uv add", "conda install", "apt-get", "apk add", "npm install")


def _documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]


def _all_documents() -> Iterator[tuple[Path, dict[str, Any]]]:
    for path in MANIFESTS:
        for doc in _documents(path):
            yield path, doc


def _crd_schema(api_version: str, kind: str) -> dict[str, Any]:
    group, _, version = api_version.partition("/")
    path = CRD_SCHEMAS / group / f"{kind.lower()}_{version}.json"
    if not path.exists():
        raise AssertionError(f"no schema for {kind} {api_version} at {path} (see {CRD_SCHEMAS}/README.md)")
    schema: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return schema


def _errors(doc: dict[str, Any]) -> list[str]:
    """Schema errors of one resource; empty when it is valid."""
    import jsonschema
    import kubernetes_validate

    group = doc.get("apiVersion", "").partition("/")[0]
    if group in CRD_GROUPS:
        validator = jsonschema.Draft202012Validator(_crd_schema(doc["apiVersion"], doc["kind"]))
        return [f"{'/'.join(map(str, e.absolute_path)) or '.'}: {e.message}" for e in validator.iter_errors(doc)]
    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{'/'.join(map(str, exc.absolute_path)) or '.'}: {exc.message}"]
    return []


def _serve_configs() -> list[tuple[str, dict[str, Any]]]:
    configs = [("serve_config.yaml", yaml.safe_load(SERVE_CONFIG.read_text(encoding="utf-8")))]
    for path, doc in _all_documents():
        if doc["kind"] == "RayService":
            configs.append((f"{path.name}:{doc['metadata']['name']}", yaml.safe_load(doc["spec"]["serveConfigV2"])))
    return configs


def _containers(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("containers", "initContainers") and isinstance(value, list):
                yield from value
            else:
                yield from _containers(value)
    elif isinstance(node, list):
        for item in node:
            yield from _containers(item)


def test_crd_schemas_are_present() -> None:
    assert CRD_SCHEMAS.is_dir(), f"CRD schemas not found at {CRD_SCHEMAS}; set FEDFRAUD_K8S_SCHEMAS"


@pytest.mark.parametrize("path", MANIFESTS, ids=[p.name for p in MANIFESTS])
def test_manifest_validates(path: Path) -> None:
    docs = _documents(path)
    assert docs, f"{path.name} holds no resource"
    problems = [f"{d['kind']}/{d['metadata'].get('name')}: {err}" for d in docs for err in _errors(d)]
    assert not problems, f"{path.name}:\n" + "\n".join(problems)


def test_the_issue_s_resources_are_all_there() -> None:
    kinds = {(doc["apiVersion"], doc["kind"]) for _, doc in _all_documents()}
    for wanted in [
        ("kafka.strimzi.io/v1", "Kafka"), ("kafka.strimzi.io/v1", "KafkaNodePool"),
        ("kafka.strimzi.io/v1", "KafkaTopic"), ("kafka.strimzi.io/v1", "KafkaUser"),
        ("ray.io/v1", "RayService"), ("monitoring.coreos.com/v1", "ServiceMonitor"),
        ("v1", "PersistentVolumeClaim"), ("v1", "Secret"), ("networking.k8s.io/v1", "NetworkPolicy"),
        ("apps/v1", "StatefulSet"), ("batch/v1", "Job"),
    ]:
        assert wanted in kinds, wanted
    (ray,) = [doc for _, doc in _all_documents() if doc["kind"] == "RayService"]
    assert ray["spec"]["rayClusterConfig"]["enableInTreeAutoscaling"] is True


def test_strict_schemas_reject_a_misspelt_field() -> None:
    """The checks above are not vacuous: one wrong key in a custom and in a core resource is caught."""
    (ray,) = [copy.deepcopy(doc) for _, doc in _all_documents() if doc["kind"] == "RayService"]
    cluster = ray["spec"]["rayClusterConfig"]
    cluster["enableInTreeAutoscalling"] = cluster.pop("enableInTreeAutoscaling")
    assert any("enableInTreeAutoscalling" in e for e in _errors(ray))
    (topic,) = [copy.deepcopy(d) for _, d in _all_documents() if d["kind"] == "KafkaTopic"][:1]
    topic["spec"]["partitions"] = 0
    assert _errors(topic)
    (redis,) = [copy.deepcopy(d) for _, d in _all_documents() if d["kind"] == "StatefulSet" and
                d["metadata"]["name"] == "redis"]
    redis["spec"]["replica"] = redis["spec"].pop("replicas")
    assert _errors(redis)


def test_no_pod_installs_packages_at_start_up() -> None:
    """Images carry the dependencies (infra/docker): no container command and no Serve runtime_env installs any."""
    for path, doc in _all_documents():
        for container in _containers(doc):
            line = " ".join(map(str, container.get("command", []) + container.get("args", [])))
            assert not any(tool in line for tool in INSTALLERS), f"{path.name}: {container['name']}: {line}"
    for name, config in _serve_configs():
        envs = [config.get("runtime_env") or {}] + [a.get("runtime_env") or {} for a in config["applications"]]
        assert not any(key in env for env in envs for key in ("pip", "conda", "uv")), name


@pytest.mark.parametrize("name,config", _serve_configs(), ids=[n for n, _ in _serve_configs()])
def test_serve_config_is_valid_for_ray_and_for_the_app(name: str, config: dict[str, Any]) -> None:
    from ray.serve.schema import ServeDeploySchema

    from fedfraud.config import FedfraudConfig
    from fedfraud.serving.app import ScoringArgs

    ServeDeploySchema.model_validate(config)
    partitions = {d["metadata"]["name"]: d["spec"]["partitions"] for _, d in _all_documents()
                  if d["kind"] == "KafkaTopic"}
    for app in config["applications"]:
        assert app["import_path"] == "fedfraud.serving.app:build_app"
        args = ScoringArgs.model_validate(app["args"])
        cfg = FedfraudConfig.model_validate(args.config)
        assert cfg.features.registry.type == "sql", "replicas share one Feast registry, not a file per pod"
        for deployment in app.get("deployments", []):
            most = (deployment.get("autoscaling_config") or {}).get("max_replicas", deployment.get("num_replicas"))
            assert isinstance(most, int) and most <= partitions["transactions"], (
                f"{name}: up to {most} StreamScorer replicas but {partitions['transactions']} partitions")


def _claims(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        claim = node.get("persistentVolumeClaim")
        if isinstance(claim, dict):
            yield claim["claimName"]
        for value in node.values():
            yield from _claims(value)
    elif isinstance(node, list):
        for item in node:
            yield from _claims(item)


def test_every_mounted_volume_claim_exists_in_the_pod_s_namespace() -> None:
    """A PersistentVolumeClaim belongs to one namespace: a pod elsewhere cannot mount it (the scorers and the
    retraining CronJob must share one model-registry claim, not two names in two namespaces).
    """
    declared = {(d["metadata"].get("namespace"), d["metadata"]["name"]) for _, d in _all_documents()
                if d["kind"] == "PersistentVolumeClaim"}
    missing = [f"{path.name}: {doc['kind']}/{doc['metadata']['name']} mounts {claim!r} in "
               f"{doc['metadata'].get('namespace')!r}"
               for path, doc in _all_documents() if doc["kind"] != "PersistentVolumeClaim"
               for claim in _claims(doc) if (doc["metadata"].get("namespace"), claim) not in declared]
    assert not missing, "\n".join(missing)
