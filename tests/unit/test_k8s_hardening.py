"""Kubernetes hardening of ``infra/k8s`` (issue 37, findings 3 and 6), checked offline on the parsed manifests.

- Every pod the manifests define (Deployments, StatefulSets, Jobs, CronJobs, the RayService's head and worker
  groups, the Flower pods) runs as a non-root uid with a read-only root filesystem, no privilege escalation, no
  capabilities and the runtime's seccomp profile; the pods the operators make (KubeRay's autoscaler, Strimzi's)
  get the same through the operators' templates.
- Every image is pinned to a version (no ``latest``, no bare name); the project's own images are the tags that
  ``infra/docker`` builds.
- A Secret reaches a container as a read-only 0400 file, or as an environment variable only where fedfraud can
  read nothing else (``ENV_ONLY_SECRETS``, with the reason), and never in argv.
- Every namespace denies egress by default; a small NetworkPolicy evaluator (matchLabels, ports, ipBlock: the
  subset these manifests use) checks the flows the app needs are allowed and the dangerous ones are not: the
  Flower Control API from outside, the Ray dashboard from any pod but KubeRay's operator.
- Flower 1.41 serves Fleet, Control and its Runtime API on one listener; the SuperLink pod binds it to loopback
  and an nginx sidecar gives Fleet and Control a port each. The path split is checked against the routes of the
  installed flwr and the paths its SuperNode and CLI clients call.
"""

from __future__ import annotations

import inspect
import ipaddress
import re
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = sorted((ROOT / "infra" / "k8s").glob("*.yaml"))
DOCKERFILES = sorted((ROOT / "infra" / "docker").glob("*.Dockerfile"))

#: Secrets that reach a container as an environment variable, and why: fedfraud reads them from a variable only.
#: A name not listed here must come as a file (a Secret volume). Shrink this when the app learns to read a file.
ENV_ONLY_SECRETS = {
    "FEDFRAUD_BANK_SECRET": "feature_store/privacy.py reads $FEDFRAUD_BANK_SECRET only",
    "FEDFRAUD_FEDERATION_KEY": "feature_store/privacy.py reads $FEDFRAUD_FEDERATION_KEY only",
    "FEDFRAUD_REDIS_PASSWORD": "features.redis.password_env / serving.fraud_state_password_env name a variable; "
                               "no file option",
    "FEDFRAUD_KAFKA_PASSWORD": "serving.kafka_security.sasl_password_env names a variable; no file option",
    "FEDFRAUD_FEAST_REGISTRY_PASSWORD": "features.registry.password_env: Feast expands ${VAR} in feature_store.yaml",
}


def _documents() -> Iterator[tuple[Path, dict[str, Any]]]:
    for path in MANIFESTS:
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if doc:
                yield path, doc


DOCS = list(_documents())


def _one(kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for _, d in DOCS if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def _pod_templates() -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(where, namespace, pod template) of every pod the manifests define."""
    for path, doc in DOCS:
        kind, meta, spec = doc["kind"], doc["metadata"], doc.get("spec") or {}
        where, ns = f"{path.name}:{kind}/{meta['name']}", meta.get("namespace", "default")
        if kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"):
            yield where, ns, spec["template"]
        elif kind == "CronJob":
            yield where, ns, spec["jobTemplate"]["spec"]["template"]
        elif kind == "RayService":
            cluster = spec["rayClusterConfig"]
            yield f"{where}/head", ns, cluster["headGroupSpec"]["template"]
            for group in cluster.get("workerGroupSpecs", []):
                yield f"{where}/{group['groupName']}", ns, group["template"]
        elif kind == "Pod":
            yield where, ns, doc


PODS = list(_pod_templates())
POD_IDS = [where for where, _, _ in PODS]


def _containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    spec = pod["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def _args(container: dict[str, Any]) -> list[str]:
    return [str(a) for a in container.get("command", []) + container.get("args", [])]


def _flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def _hardened_container(ctx: dict[str, Any] | None) -> list[str]:
    """What a container's securityContext lacks of the restricted set (empty: nothing)."""
    ctx = ctx or {}
    caps = ctx.get("capabilities") or {}
    problems = []
    if ctx.get("allowPrivilegeEscalation") is not False:
        problems.append("allowPrivilegeEscalation is not false")
    if ctx.get("readOnlyRootFilesystem") is not True:
        problems.append("readOnlyRootFilesystem is not true")
    if "ALL" not in (caps.get("drop") or []):
        problems.append("capabilities do not drop ALL")
    if caps.get("add"):
        problems.append(f"capabilities add {caps['add']}")
    if ctx.get("privileged"):
        problems.append("privileged")
    return problems


def _hardened_pod(ctx: dict[str, Any] | None) -> list[str]:
    ctx = ctx or {}
    problems = []
    if ctx.get("runAsNonRoot") is not True:
        problems.append("pod runAsNonRoot is not true")
    if not isinstance(ctx.get("runAsUser"), int) or ctx["runAsUser"] <= 0:
        problems.append("pod runAsUser is not a non-root uid")
    if (ctx.get("seccompProfile") or {}).get("type") != "RuntimeDefault":
        problems.append("pod seccompProfile is not RuntimeDefault")
    return problems


@pytest.mark.parametrize("where,ns,pod", PODS, ids=POD_IDS)
def test_pod_runs_non_root_read_only_without_privileges(where: str, ns: str, pod: dict[str, Any]) -> None:
    spec = pod["spec"]
    problems = _hardened_pod(spec.get("securityContext"))
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    for container in _containers(pod):
        ctx = container.get("securityContext") or {}
        name = container["name"]
        problems += [f"{name}: {p}" for p in _hardened_container(ctx)]
        user = ctx.get("runAsUser", (spec.get("securityContext") or {}).get("runAsUser"))
        if not isinstance(user, int) or user <= 0:
            problems.append(f"{name}: runs as uid {user!r}")
        if ctx.get("runAsNonRoot") is False:
            problems.append(f"{name}: runAsNonRoot overridden to false")
        tmp = [m for m in container.get("volumeMounts", []) if m["mountPath"] == "/tmp"]
        if not tmp or "emptyDir" not in volumes.get(tmp[0]["name"], {}):
            problems.append(f"{name}: no writable /tmp (an emptyDir) under the read-only root filesystem")
    assert not problems, f"{where}:\n" + "\n".join(problems)


def test_pods_made_by_the_operators_are_hardened_through_their_templates() -> None:
    """KubeRay adds an autoscaler container to the head pod; Strimzi makes the brokers and the entity operator."""
    assert len(PODS) >= 10, POD_IDS  # the pods of the manifests themselves are each checked above
    (ray,) = [d for _, d in DOCS if d["kind"] == "RayService"]
    autoscaler = ray["spec"]["rayClusterConfig"]["autoscalerOptions"]
    problems = [f"KubeRay autoscaler: {p}" for p in _hardened_container(autoscaler.get("securityContext"))]
    (pool,) = [d for _, d in DOCS if d["kind"] == "KafkaNodePool"]
    template = pool["spec"].get("template") or {}
    problems += [f"KafkaNodePool pod: {p}" for p in _hardened_pod((template.get("pod") or {}).get("securityContext"))]
    problems += [f"KafkaNodePool kafka: {p}"
                 for p in _hardened_container((template.get("kafkaContainer") or {}).get("securityContext"))]
    (kafka,) = [d for _, d in DOCS if d["kind"] == "Kafka"]
    eo = kafka["spec"]["entityOperator"].get("template") or {}
    problems += [f"entity operator pod: {p}" for p in _hardened_pod((eo.get("pod") or {}).get("securityContext"))]
    for part in ("topicOperatorContainer", "userOperatorContainer"):
        problems += [f"entity operator {part}: {p}"
                     for p in _hardened_container((eo.get(part) or {}).get("securityContext"))]
    assert not problems, "\n".join(problems)


def _built_images() -> set[str]:
    """The tags ``infra/docker``'s Dockerfiles say they are built as (their ``docker build ... -t TAG`` lines)."""
    return {m for path in DOCKERFILES for m in re.findall(r"docker build .*?-t (\S+)", path.read_text())}


def test_every_image_is_pinned_and_the_project_s_own_are_built_here() -> None:
    built = _built_images()
    assert {"registry.example.com/fedfraud:0.1.0", "registry.example.com/fedfraud-superlink:0.1.0",
            "registry.example.com/fedfraud-supernode:0.1.0"} <= built, built
    problems = []
    for where, _, pod in PODS:
        for container in _containers(pod):
            image = container["image"]
            name, _, digest = image.partition("@")
            repo, _, tag = name.rpartition(":") if ":" in name.rsplit("/", 1)[-1] else (name, "", "")
            if digest:
                if not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
                    problems.append(f"{where}: {image}: malformed digest")
            elif not tag:
                problems.append(f"{where}: {image}: no tag (that is `latest`)")
            elif not re.match(r"v?\d+\.\d+", tag):
                problems.append(f"{where}: {image}: tag {tag!r} is not a version")
            if "latest" in image:
                problems.append(f"{where}: {image}: latest")
            if repo.startswith("registry.example.com/") and image not in built:
                problems.append(f"{where}: {image}: infra/docker builds no such image ({sorted(built)})")
    assert not problems, "\n".join(problems)


def test_secrets_are_read_only_files_and_env_only_where_the_app_reads_nothing_else() -> None:
    problems = []
    for where, _, pod in PODS:
        volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
        for vol in volumes.values():
            secret = vol.get("secret")
            if secret is None:
                continue
            modes = {secret.get("defaultMode")} | {i.get("mode", secret.get("defaultMode"))
                                                    for i in secret.get("items", [])}
            if modes != {0o400}:
                problems.append(f"{where}: Secret volume {vol['name']} mode {sorted(map(str, modes))}, not 0400")
        for container in _containers(pod):
            name = container["name"]
            from_secret = set()
            for env in container.get("env", []):
                if "secretKeyRef" in (env.get("valueFrom") or {}):
                    from_secret.add(env["name"])
                    if env["name"] not in ENV_ONLY_SECRETS:
                        problems.append(f"{where}: {name}: ${env['name']} from a Secret in the environment; mount "
                                        f"it as a file (or name the reason in ENV_ONLY_SECRETS)")
            problems += [f"{where}: {name}: envFrom a whole Secret" for e in container.get("envFrom", [])
                         if "secretRef" in e]
            line = " ".join(_args(container))
            problems += [f"{where}: {name}: ${var} from a Secret expanded into argv" for var in from_secret
                         if f"$({var})" in line]
            for mount in container.get("volumeMounts", []):
                if "secret" in volumes.get(mount["name"], {}) and mount.get("readOnly") is not True:
                    problems.append(f"{where}: {name}: Secret volume {mount['name']} mounted writable")
    assert not problems, "\n".join(problems)


def test_the_api_token_is_a_mounted_file_the_serve_config_names() -> None:
    (ray,) = [d for _, d in DOCS if d["kind"] == "RayService"]
    serve = yaml.safe_load(ray["spec"]["serveConfigV2"])
    (app,) = serve["applications"]
    token_file = (app["args"]["config"]["serving"].get("auth") or {}).get("token_file")
    assert token_file, "serving.auth.token_file is not set: the replicas would read $FEDFRAUD_API_TOKEN"
    token_file = Path(token_file)
    ray_pods = [pod for where, _, pod in PODS if "RayService" in where]
    assert len(ray_pods) == 2
    for pod in ray_pods:
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        for container in pod["spec"]["containers"]:
            (mount,) = [m for m in container["volumeMounts"] if Path(m["mountPath"]) == token_file.parent]
            secret = volumes[mount["name"]]["secret"]
            assert secret["secretName"] == "fedfraud-api-token"
            assert [i["path"] for i in secret["items"]] == [token_file.name]


def test_every_namespace_denies_egress_by_default() -> None:
    namespaces = {d["metadata"]["name"] for _, d in DOCS if d["kind"] == "Namespace"}
    assert namespaces == {"fedfraud", "kafka", "bank-0", "fedfraud-federation"}
    used = {ns for _, ns, _ in PODS} | {d["metadata"].get("namespace") for _, d in DOCS
                                         if d["kind"] in ("KafkaNodePool", "Kafka")}
    assert used <= namespaces, used - namespaces
    for ns in namespaces:
        deny = [d for _, d in DOCS if d["kind"] == "NetworkPolicy" and d["metadata"].get("namespace") == ns
                and not (d["spec"]["podSelector"] or {}).get("matchLabels")
                and not (d["spec"]["podSelector"] or {}).get("matchExpressions")
                and "Egress" in d["spec"].get("policyTypes", []) and not d["spec"].get("egress")]
        assert deny, f"namespace {ns}: no default-deny egress NetworkPolicy"


# --- a NetworkPolicy evaluator for the subset of the API these manifests use --------------------------------------

@dataclass(frozen=True)
class Pod:
    namespace: str
    labels: dict[str, str] = field(hash=False)


Peer = Pod | str  # a pod, or an address outside the cluster


def _ns_labels(ns: str) -> dict[str, str]:
    declared = {d["metadata"]["name"]: d["metadata"].get("labels") or {} for _, d in DOCS if d["kind"] == "Namespace"}
    return {"kubernetes.io/metadata.name": ns, **declared.get(ns, {})}


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert not selector.get("matchExpressions"), "the evaluator reads matchLabels only"
    return all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())


def _peer_admits(peer: dict[str, Any], policy_ns: str, other: Peer) -> bool:
    if "ipBlock" in peer:
        if not isinstance(other, str):
            return False  # the manifests' ipBlocks name outside addresses, not pods
        address = ipaddress.ip_address(other)
        block = peer["ipBlock"]
        return (address in ipaddress.ip_network(block["cidr"])
                and not any(address in ipaddress.ip_network(e) for e in block.get("except", [])))
    if isinstance(other, str):
        return False
    ns_ok = (_selects(peer["namespaceSelector"], _ns_labels(other.namespace)) if "namespaceSelector" in peer
             else other.namespace == policy_ns)
    return ns_ok and _selects(peer.get("podSelector") or {}, other.labels)


def _port_admits(rule: dict[str, Any], port: int, protocol: str) -> bool:
    ports = rule.get("ports")
    return not ports or any(p.get("protocol", "TCP") == protocol and p.get("port") in (None, port) for p in ports)


def _policy_types(spec: dict[str, Any]) -> list[str]:
    return spec.get("policyTypes") or ["Ingress", *(["Egress"] if "egress" in spec else [])]


def _admitted(direction: str, pod: Pod, other: Peer, port: int, protocol: str) -> bool:
    rules_key, peers_key = ("ingress", "from") if direction == "Ingress" else ("egress", "to")
    policies = [d for _, d in DOCS if d["kind"] == "NetworkPolicy" and d["metadata"]["namespace"] == pod.namespace
                and _selects(d["spec"]["podSelector"] or {}, pod.labels) and direction in _policy_types(d["spec"])]
    if not policies:
        return True  # a pod no policy isolates
    return any(_port_admits(rule, port, protocol)
               and (not rule.get(peers_key) or any(_peer_admits(p, pod.namespace, other) for p in rule[peers_key]))
               for policy in policies for rule in policy["spec"].get(rules_key) or [])


def _reaches(src: Peer, dst: Peer, port: int, protocol: str = "TCP") -> bool:
    """Whether the policies let ``src`` open a connection to ``dst:port`` (egress at src, ingress at dst)."""
    return ((not isinstance(src, Pod) or _admitted("Egress", src, dst, port, protocol))
            and (not isinstance(dst, Pod) or _admitted("Ingress", dst, src, port, protocol)))


def _pod_of(kind: str, name: str, **extra: str) -> Pod:
    doc = _one(kind, name)
    spec = doc["spec"]
    template = spec["jobTemplate"]["spec"]["template"] if kind == "CronJob" else spec["template"]
    return Pod(doc["metadata"]["namespace"], {**(template.get("metadata") or {}).get("labels", {}), **extra})


def _ray(node_type: str) -> Pod:
    (ray,) = [d for _, d in DOCS if d["kind"] == "RayService"]
    labels = ray["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["metadata"]["labels"]
    return Pod(ray["metadata"]["namespace"], {**labels, "ray.io/node-type": node_type, "ray.io/is-ray-node": "yes"})


KUBE_DNS = Pod("kube-system", {"k8s-app": "kube-dns"})
KUBERAY_OPERATOR = Pod("ray-system", {"app.kubernetes.io/name": "kuberay-operator"})
BROKER = Pod("kafka", {"strimzi.io/cluster": "fedfraud", "strimzi.io/kind": "Kafka",
                       "strimzi.io/name": "fedfraud-kafka", "strimzi.io/pool-name": "dual-role",
                       "strimzi.io/broker-role": "true"})
INTERNET = "8.8.8.8"


def test_the_app_s_own_flows_are_allowed_and_nothing_else_leaves() -> None:
    head, worker = _ray("head"), _ray("worker")
    redis, postgres = _pod_of("StatefulSet", "redis"), _pod_of("StatefulSet", "feast-registry")
    features, joiner = _pod_of("Job", "fedfraud-features-apply"), _pod_of("Deployment", "fedfraud-label-joiner")
    retrain = _pod_of("CronJob", "fedfraud-retrain")
    for src in (head, worker):
        assert _reaches(src, redis, 6379) and _reaches(src, postgres, 5432) and _reaches(src, BROKER, 9093)
        assert _reaches(src, KUBE_DNS, 53, "UDP") and _reaches(src, KUBE_DNS, 53, "TCP")
        assert not _reaches(src, INTERNET, 443) and not _reaches(src, INTERNET, 80)
    assert _reaches(worker, head, 6379) and _reaches(head, worker, 10002)  # GCS, a worker's gRPC port
    assert _reaches(features, redis, 6379) and _reaches(features, postgres, 5432)
    assert not _reaches(features, INTERNET, 443) and not _reaches(features, BROKER, 9093)
    assert _reaches(joiner, BROKER, 9093) and not _reaches(joiner, redis, 6379)
    assert not _reaches(joiner, INTERNET, 443)
    assert _reaches(retrain, KUBE_DNS, 53, "UDP") and not _reaches(retrain, INTERNET, 443)
    for pod in (redis, postgres):
        assert not _reaches(pod, INTERNET, 443) and not _reaches(pod, head, 8265)
    broker_peer = Pod("kafka", {**BROKER.labels, "strimzi.io/name": "fedfraud-kafka", "strimzi.io/pool-name": "x"})
    assert _reaches(BROKER, broker_peer, 9091) and not _reaches(BROKER, INTERNET, 443)


def test_the_ray_dashboard_admits_the_kuberay_operator_s_pods_only() -> None:
    head = _ray("head")
    assert _reaches(KUBERAY_OPERATOR, head, 8265) and _reaches(KUBERAY_OPERATOR, head, 52365)
    for intruder in (Pod("ray-system", {"app": "something-else"}), Pod("fedfraud", {"app": "label-joiner"}),
                     Pod("other", {"app.kubernetes.io/name": "kuberay-operator"}), INTERNET):
        assert not _reaches(intruder, head, 8265), intruder
        assert not _reaches(intruder, head, 52365), intruder


# --- Flower: one listener in flwr 1.41, split into a port per API -------------------------------------------------

def _superlink() -> tuple[dict[str, Any], dict[str, Any]]:
    pod = _one("Deployment", "flower-superlink")["spec"]["template"]
    containers = {c["name"]: c for c in pod["spec"]["containers"]}
    superlink = next(c for c in containers.values() if "flower-superlink" in _args(c))
    gateways = [c for c in containers.values() if c is not superlink]
    assert len(gateways) == 1, list(containers)
    return superlink, gateways[0]


def _ports() -> dict[str, int]:
    superlink, gateway = _superlink()
    named = {p.get("name"): p["containerPort"] for p in gateway.get("ports", [])}
    assert not superlink.get("ports"), "the SuperLink's own listener is loopback only: no container port"
    return {"runtime": int(_flag(_args(superlink), "--port")), "fleet": named.get("fleet", 0),
            "control": named.get("control", 0)}


def _nginx_servers() -> dict[int, dict[str, str]]:
    """listen port -> {location: body} of the gateway's nginx.conf (the small subset it uses)."""
    conf = _one("ConfigMap", "superlink-gateway")["data"]["nginx.conf"]
    servers: dict[int, dict[str, str]] = {}
    for match in re.finditer(r"\bserver\s*\{", conf):
        depth, i = 1, match.end()
        while depth:
            depth += {"{": 1, "}": -1}.get(conf[i], 0)
            i += 1
        block = conf[match.end():i - 1]
        (port,) = re.findall(r"listen\s+(\d+)\s+ssl;", block)
        locations = {m.group(1).strip(): m.group(2)
                     for m in re.finditer(r"location\s+([^{]+?)\s*\{((?:[^{}]|\{[^{}]*\})*)\}", block)}
        servers[int(port)] = locations
    return servers


def test_fleet_control_and_runtime_are_three_distinct_ports_and_flower_binds_loopback() -> None:
    superlink, _ = _superlink()
    args = _args(superlink)
    ports = _ports()
    assert len(set(ports.values())) == 3 and 0 not in ports.values(), ports
    assert _flag(args, "--host") == "127.0.0.1", "the SuperLink's one listener serves all three APIs"
    assert "--enable-supernode-auth" in args and "--insecure" not in args
    # the clients dial the port of their own API
    supernode = _one("Deployment", "flower-supernode-bank-0")["spec"]["template"]["spec"]["containers"][0]
    assert int(_flag(_args(supernode), "--superlink").rsplit(":", 1)[1]) == ports["fleet"]
    cli = tomllib.loads(_one("ConfigMap", "flwr-cli-config")["data"]["config.toml"])
    assert int(cli["superlink"]["fedfraud"]["address"].rsplit(":", 1)[1]) == ports["control"]
    # only Fleet is exposed beyond the cluster
    for _, doc in DOCS:
        if doc["kind"] == "Service" and doc["spec"].get("selector") == {"app": "superlink"}:
            targets = {p.get("targetPort", p["port"]) for p in doc["spec"]["ports"]}
            assert not targets & {"control", ports["control"], ports["runtime"]} or \
                doc["spec"].get("type", "ClusterIP") == "ClusterIP", doc["metadata"]["name"]


def test_the_gateway_passes_each_port_its_own_api_only() -> None:
    from flwr.superlink.routers.control.router import router as control_router
    from flwr.superlink.routers.fleet.router import router as fleet_router

    ports, servers = _ports(), _nginx_servers()
    assert set(servers) == {ports["fleet"], ports["control"]}
    conf = _one("ConfigMap", "superlink-gateway")["data"]["nginx.conf"]
    assert re.search(r"upstream superlink \{ server 127\.0\.0\.1:(\d+);", conf).group(1) == str(ports["runtime"])
    proxied = {port: {loc for loc, body in locs.items() if "proxy_pass" in body} for port, locs in servers.items()}
    assert proxied[ports["fleet"]] == {f"{fleet_router.prefix}/", "= /health"}
    assert proxied[ports["control"]] == {f"{control_router.prefix}/"}
    for locations in servers.values():
        assert "return 404" in locations["/"], "every other path is refused"
    # every call Flower's own clients make passes the gateway's exact-path check, and no other API's does
    from flwr.supercore.control import control_http_client
    from flwr.supernode import fleet_http_client

    fleet_paths = set(re.findall(r'path="(/v1/[^"]+)"', inspect.getsource(fleet_http_client)))
    control_paths = set(re.findall(r'path="(/v1/[^"]+)"', inspect.getsource(control_http_client)))
    assert fleet_paths and control_paths
    for port, paths, other in ((ports["fleet"], fleet_paths, control_paths),
                               (ports["control"], control_paths, fleet_paths)):
        (guard,) = [re.search(r'\$request_uri !~ "([^"]+)"', body).group(1)
                    for body in servers[port].values() if "$request_uri" in body]
        assert all(re.search(guard, p) for p in paths), (port, guard)
        assert not any(re.search(guard, p) for p in other | {"/v1/runtime/acquire-task"}), (port, guard)
        assert not re.search(guard, "/v1/fleet/../control/start-run") and not re.search(guard, "/v1/fleet/x?a=b")


def test_the_control_port_is_never_admitted_from_outside_the_operator_s_pods() -> None:
    ports = _ports()
    superlink = _pod_of("Deployment", "flower-superlink")
    operator = _pod_of("Job", "flower-register-supernodes")
    assert operator.labels.get("app") == "flower-operator"
    for _, doc in DOCS:  # structurally: no ipBlock, and no all-peers rule, ever covers Control or Runtime
        if doc["kind"] == "NetworkPolicy" and _selects(doc["spec"]["podSelector"] or {}, superlink.labels) and \
                doc["metadata"]["namespace"] == superlink.namespace:
            for rule in doc["spec"].get("ingress") or []:
                covers = {p.get("port") for p in rule.get("ports") or [{}]}
                if covers & {None, ports["control"], ports["runtime"]}:
                    peers = rule.get("from") or []
                    assert peers and not any("ipBlock" in p for p in peers), doc["metadata"]["name"]
                    assert all("podSelector" in p for p in peers), "a namespace-wide peer: " + doc["metadata"]["name"]
    bank = "198.51.100.5"  # inside the example range of bank 0 in flower.yaml
    assert _reaches(bank, superlink, ports["fleet"])
    for outsider in (bank, INTERNET, "10.1.2.3"):
        assert not _reaches(outsider, superlink, ports["control"]), outsider
        assert not _reaches(outsider, superlink, ports["runtime"]), outsider
    assert not _reaches(INTERNET, superlink, ports["fleet"])
    assert _reaches(operator, superlink, ports["control"])
    assert not _reaches(operator, superlink, ports["runtime"]) and not _reaches(operator, INTERNET, 443)
    for intruder in (Pod("fedfraud-federation", {"app": "something-else"}),
                     Pod("fedfraud", {"app": "flower-operator"}), _ray("worker")):
        assert not _reaches(intruder, superlink, ports["control"]), intruder


def test_the_supernode_dials_the_fleet_port_and_nothing_else() -> None:
    supernode = _pod_of("Deployment", "flower-supernode-bank-0")
    superlink_address = "203.0.113.10"  # the example public address of the SuperLink in flower.yaml
    fleet = _ports()["fleet"]
    assert _reaches(supernode, superlink_address, fleet)
    assert not _reaches(supernode, superlink_address, _ports()["control"])
    assert not _reaches(supernode, INTERNET, fleet) and not _reaches(supernode, INTERNET, 443)
    assert not _reaches(Pod("bank-0", {"app": "intruder"}), supernode, 9094)  # nothing dials into a bank


def test_the_supernode_keeps_its_privacy_ledger_on_a_writable_persistent_volume_of_its_own() -> None:
    """A read-only or scratch ledger would refuse every DP run, or start a fresh budget with every new pod."""
    import shlex

    from fedfraud.training.federated.ledger import BUDGET_KEY, LEDGER_KEY, PrivacyLedger

    ns, pod = next((ns, pod) for where, ns, pod in PODS if where.endswith("Deployment/flower-supernode-bank-0"))
    (container,) = pod["spec"]["containers"]
    node_config = dict(item.split("=", 1) for item in shlex.split(_flag(_args(container), "--node-config")))
    ledger = PrivacyLedger.for_node(node_config)
    assert float(node_config[BUDGET_KEY]) > 0 and ledger.budget_epsilon > 0 and LEDGER_KEY in node_config
    mounts = [m for m in container["volumeMounts"] if ledger.path.is_relative_to(m["mountPath"])]
    assert len(mounts) == 1 and not mounts[0].get("readOnly", False)
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == mounts[0]["name"]]
    claim = _one("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"])
    assert claim["metadata"]["namespace"] == ns
