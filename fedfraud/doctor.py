"""``fedfraud doctor``: one line per check of a deployment's config, secrets, transports, listeners and images.

An operator runs it against the config a deployment uses (``fedfraud -c prod.yaml doctor``) before going live,
and with ``--pid`` against a running ``fedfraud serve``. Each check says ``ok``, ``warn`` or ``fail`` and why; a
``fail`` makes the command exit 1. The checks read what the product itself reads (the typed config, the secret
variables it names, the sockets of the process tree), so they cannot drift from what runs.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from fedfraud.config import FedfraudConfig
from fedfraud.core.net import is_loopback

__all__ = ["Check", "check_config", "check_images", "check_listeners", "find_serve_processes", "run_checks"]

Status = Literal["ok", "warn", "fail"]


@dataclass(frozen=True)
class Check:
    """One verdict: which check, its status, and a one-line reason an operator can act on."""

    name: str
    status: Status
    detail: str

    def line(self) -> str:
        return f"{self.status.upper():<4}  {self.name:<22} {self.detail}"

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def _hosts(servers: str) -> list[str]:
    """Hosts of a ``host:port[,host:port]`` list (Kafka bootstrap, Feast's Redis string)."""
    out = []
    for part in servers.split(","):
        part = part.strip()
        if not part or "=" in part:
            continue
        host, sep, _ = part.rpartition(":")
        out.append(host if sep else part)
    return out


def _secret_set(var: str) -> bool:
    return bool(os.environ.get(var, "").strip())


def _auth(cfg: FedfraudConfig) -> Check:
    auth = cfg.serving.auth
    if auth.disabled:
        return Check("http auth", "fail", "serving.auth.disabled: /score, /metrics and /tokenizer answer anyone")
    if auth.token_file:
        path = Path(auth.token_file)
        if not path.is_file():
            return Check("http auth", "fail", f"serving.auth.token_file {path} does not exist")
        if path.stat().st_mode & 0o077:
            return Check("http auth", "warn", f"{path} is readable by group or others (chmod 600)")
        return Check("http auth", "ok", f"bearer token from {path}")
    from fedfraud.core.credentials import API_TOKEN_ENV as TOKEN_ENV

    if _secret_set(TOKEN_ENV):
        return Check("http auth", "ok", f"bearer token from ${TOKEN_ENV}")
    return Check("http auth", "fail", f"no API token: set ${TOKEN_ENV} or serving.auth.token_file")


def _bank_secret(cfg: FedfraudConfig) -> Check:
    from fedfraud.feature_store.privacy import FEDERATION_KEY_ENV, SIMULATION_SECRET_ENV
    from fedfraud.feature_store.privacy import SECRET_ENV as BANK_SECRET_ENV

    if _secret_set(BANK_SECRET_ENV):
        if not _secret_set(FEDERATION_KEY_ENV):
            return Check("bank secret", "fail", f"${BANK_SECRET_ENV} without ${FEDERATION_KEY_ENV}")
        return Check("bank secret", "ok", f"${BANK_SECRET_ENV} and ${FEDERATION_KEY_ENV} set")
    if cfg.privacy.secret_seed:
        return Check("bank secret", "fail", "privacy.secret_seed: a secret in the config file (demo only)")
    if _secret_set(SIMULATION_SECRET_ENV):
        return Check("bank secret", "warn", f"${SIMULATION_SECRET_ENV}: one secret for every simulated bank "
                     "(demo, bench, tests); a bank deployment sets its own")
    return Check("bank secret", "fail", f"no bank secret: set ${BANK_SECRET_ENV} and ${FEDERATION_KEY_ENV}")


def _kafka(cfg: FedfraudConfig) -> Check:
    s = cfg.serving
    sec = s.kafka_security
    if s.bootstrap_servers is None:
        return Check("kafka transport", "ok", "embedded broker on loopback (demo and tests; no bootstrap_servers)")
    remote = [h for h in _hosts(s.bootstrap_servers) if not is_loopback(h)]
    if sec.security_protocol.startswith("SASL") and not _secret_set(sec.sasl_password_env):
        return Check("kafka transport", "fail", f"SASL without its password: set ${sec.sasl_password_env}")
    if remote and not sec.uses_tls:
        return Check("kafka transport", "fail", f"{sec.security_protocol} to {','.join(remote)}: transactions and "
                     "decisions cross the network in clear (serving.kafka_security.security_protocol: SASL_SSL)")
    if remote and not sec.ssl_cafile:
        return Check("kafka transport", "warn", "TLS with the system CA bundle (serving.kafka_security.ssl_cafile "
                     "pins the brokers' CA)")
    return Check("kafka transport", "ok", f"{sec.security_protocol} to {s.bootstrap_servers}")


def _redis_features(cfg: FedfraudConfig) -> Check:
    f = cfg.features
    if f.profile.strip().lower() != "redis":
        return Check("redis (features)", "ok", f"{f.profile} online store on this machine")
    r = f.redis
    remote = [h for h in _hosts(r.connection_string) if not is_loopback(h)]
    if remote and not r.ssl:
        return Check("redis (features)", "fail", f"plaintext to {','.join(remote)} (features.redis.ssl: true)")
    if r.password() is None:
        status: Status = "fail" if remote else "warn"
        return Check("redis (features)", status, f"no AUTH: ${r.password_env} is unset")
    return Check("redis (features)", "ok", r.where())


def _redis_state(cfg: FedfraudConfig) -> Check:
    from urllib.parse import urlsplit

    s = cfg.serving
    url = s.fraud_state_path
    if not url.startswith(("redis://", "rediss://")):
        return Check("redis (state)", "ok", f"SQLite file {url} in the feature repo")
    host = urlsplit(url).hostname or ""
    if not is_loopback(host) and url.startswith("redis://"):
        return Check("redis (state)", "fail", f"plaintext to {host} (rediss:// and serving.fraud_state_ca_file)")
    if not _secret_set(s.fraud_state_password_env):
        status: Status = "warn" if is_loopback(host) else "fail"
        return Check("redis (state)", status, f"no AUTH: ${s.fraud_state_password_env} is unset")
    return Check("redis (state)", "ok", f"{urlsplit(url).scheme}://{host}")


def _ray(cfg: FedfraudConfig) -> Iterator[Check]:
    for key, host in (("serving.ray_host", cfg.serving.ray_host), ("federated.ray_host", cfg.federated.ray_host)):
        if is_loopback(host):
            yield Check(key, "ok", "Ray's GCS, raylet and workers on loopback")
        else:
            yield Check(key, "warn", f"{host}: Ray 2.55 then listens on every interface with no credential; only "
                        "the cluster's nodes may reach them (firewall or NetworkPolicy, docs/security.md)")
    from fedfraud.serving.grpc_bind import GRPC_BY_DEFAULT_ENV

    if os.environ.get(GRPC_BY_DEFAULT_ENV, "0") == "1":
        yield Check("serve replica grpc", "warn", f"{GRPC_BY_DEFAULT_ENV}=1: each replica's unauthenticated gRPC "
                    "server listens on the node's address; only the cluster's nodes may reach it")
    else:
        yield Check("serve replica grpc", "ok", "each replica's gRPC server on loopback (serving/grpc_bind.py)")
    if cfg.serving.direct_ingress:
        yield Check("direct ingress", "warn", "alpha in Ray 2.55: under `fedfraud serve` each replica answers HTTP "
                    "on a loopback port of its own (30000-30999) behind the front on http_host:http_port "
                    "(serving/front.py, one machine); under `serve deploy` those ports are on Serve's http_options "
                    "host, and a firewall that admits the proxy's port must admit that range too, or nothing")


def _federated_xgboost(cfg: FedfraudConfig) -> Check:
    fraud = cfg.fraud
    host = getattr(fraud, "federated_host", "127.0.0.1")
    if not fraud.federated_tls:
        status: Status = "warn" if is_loopback(host) else "fail"
        return Check("federated xgboost", status, f"fraud.federated_tls: false: histograms in clear on {host}")
    return Check("federated xgboost", "ok", f"mutual TLS on {host}")


def check_config(cfg: FedfraudConfig) -> list[Check]:
    """Every check that reads the config and the environment only."""
    checks = [_auth(cfg), _bank_secret(cfg), _kafka(cfg), _redis_features(cfg), _redis_state(cfg)]
    checks += list(_ray(cfg))
    checks.append(_federated_xgboost(cfg))
    return checks


#: ``image: repo[:tag][@sha256:digest]`` in a manifest or a compose file.
_IMAGE = re.compile(r"^\s*-?\s*image:\s*[\"']?([^\s\"'#]+)", re.MULTILINE)


def _image_status(image: str) -> tuple[Status, str]:
    if "@sha256:" in image:
        return "ok", "pinned by digest"
    name, sep, tag = image.rpartition(":")
    if not sep or "/" in tag:
        return "fail", "no tag (means latest)"
    if tag == "latest":
        return "fail", "the moving tag latest"
    return "warn", "a tag, not a digest"


def check_images(manifests: Path) -> list[Check]:
    """Each container image the Kubernetes manifests under ``manifests`` run: pinned by digest, a tag, or moving."""
    found: dict[str, tuple[Status, str]] = {}
    for path in sorted(manifests.rglob("*.y*ml")):
        for image in _IMAGE.findall(path.read_text(encoding="utf-8")):
            found.setdefault(image, _image_status(image))
    if not found:
        return [Check("images", "warn", f"no image found under {manifests}")]
    return [Check("image", status, f"{image}: {why}") for image, (status, why) in sorted(found.items())]


def find_serve_processes() -> list[int]:
    """Pids of running ``fedfraud serve`` / ``fedfraud tokenizer serve`` commands on this machine."""
    import psutil

    pids = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = proc.info.get("cmdline") or []
        words = [Path(c).name for c in cmd]
        if "serve" in words and any(w == "fedfraud" or w.startswith("fedfraud") for w in words):
            pids.append(int(proc.info["pid"]))
    return pids


def check_listeners(pids: Iterable[int]) -> list[Check]:
    """Every listening socket of each process tree: any address beyond loopback fails, naming the process."""
    import psutil

    checks = []
    for pid in pids:
        try:
            root = psutil.Process(pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error as exc:
            checks.append(Check("listeners", "fail", f"pid {pid}: cannot be read ({exc.__class__.__name__})"))
            continue
        listening, exposed = 0, []
        for proc in procs:
            try:
                conns, name = proc.net_connections(kind="inet"), proc.name()
            except psutil.Error:
                continue
            for c in conns:
                if c.status == psutil.CONN_LISTEN:
                    listening += 1
                    if not is_loopback(c.laddr.ip.removeprefix("::ffff:")):
                        exposed.append(f"{name} {c.laddr.ip}:{c.laddr.port}")
        if exposed:
            checks.append(Check("listeners", "fail", f"pid {pid}: beyond loopback: {'; '.join(exposed)}"))
        else:
            checks.append(Check("listeners", "ok", f"pid {pid}: {listening} listening sockets in {len(procs)} "
                                "processes, all on loopback"))
    return checks


def run_checks(cfg: FedfraudConfig, manifests: Path | None, pids: list[int] | None) -> list[Check]:
    """The whole report: config, images (when a manifest folder is given or ``infra/k8s`` is here), listeners."""
    checks = check_config(cfg)
    if manifests is not None:
        checks += check_images(manifests)
    found = pids if pids is not None else find_serve_processes()
    if found:
        checks += check_listeners(found)
    else:
        checks.append(Check("listeners", "warn", "no running `fedfraud serve` found (give --pid)"))
    return checks
