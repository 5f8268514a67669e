"""A Flower Deployment Engine federation on one machine: one SuperLink and one SuperNode per bank, as processes.

Why separate processes (not the simulation): each bank's SuperNode is what a
bank would run next to its data. It is given only its own bank's folder
(``--node-config "partition-id=k data-dir=<root>/bank_k"``), holds its own
authentication key, and talks to the SuperLink over TLS. The SuperLink
requires TLS (``--ssl-*``) and SuperNode authentication
(``--enable-supernode-auth``): a SuperNode whose public key was not registered
(``flwr supernode register``) is refused, and so is a plaintext connection.
Apps run with ``flwr run <app> fedfraud`` against the connection this module
writes to ``$FLWR_HOME/config.toml``; no app dependency is installed at run
time (``--disable-runtime-dependency-installation``): the SuperNodes use the
fedfraud installed next to them.

Layout of a federation folder (:class:`FederationFiles`)::

    DIR/certs/ca.crt, ca.key              the federation's CA (ca.key stays with the operator)
    DIR/certs/superlink.pem, superlink.key  the SuperLink's TLS certificate (SAN: 127.0.0.1, localhost)
    DIR/keys/bank_<k>, bank_<k>.pub       bank k's SuperNode key pair (OpenSSH P-384; the private key stays at the bank)
    DIR/flwr/config.toml                  the ``flwr`` CLI's connection ``fedfraud`` (address, CA); FLWR_HOME=DIR/flwr
    DIR/logs/*.log                        one log per process
    DIR/federation.json                   ports and process ids of a running federation (``federation down`` reads it)
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedfraud.core.errors import UserError
from fedfraud.core.net import LOOPBACK, free_port, wait_for_port
from fedfraud.core.pki import CertificateAuthority, write_certificate, write_private_key, write_ssh_key_pair

__all__ = [
    "CONNECTION",
    "STATE_FILE",
    "Federation",
    "FederationFiles",
    "flwr_env",
    "generate_federation_files",
    "run_app",
    "stop_federation",
]

logger = logging.getLogger(__name__)

#: Name of the SuperLink connection in ``$FLWR_HOME/config.toml`` (``flwr run <app> fedfraud``).
CONNECTION = "fedfraud"
STATE_FILE = "federation.json"


@dataclass(frozen=True)
class FederationFiles:
    """Where a federation's TLS material, keys, Flower config and logs live under one folder."""

    root: Path

    @property
    def ca_cert(self) -> Path:
        return self.root / "certs" / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.root / "certs" / "ca.key"

    @property
    def server_cert(self) -> Path:
        return self.root / "certs" / "superlink.pem"

    @property
    def server_key(self) -> Path:
        return self.root / "certs" / "superlink.key"

    def bank_key(self, bank: int) -> Path:
        """Bank ``bank``'s SuperNode private key (OpenSSH); its public key is this path + ``.pub``."""
        return self.root / "keys" / f"bank_{bank}"

    def bank_public_key(self, bank: int) -> Path:
        return self.root / "keys" / f"bank_{bank}.pub"

    @property
    def flwr_home(self) -> Path:
        return self.root / "flwr"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def banks(self) -> list[int]:
        """Banks that have a key pair here, sorted."""
        found = []
        for pub in (self.root / "keys").glob("bank_*.pub"):
            suffix = pub.name[len("bank_"):-len(".pub")]
            if suffix.isdigit() and self.bank_key(int(suffix)).exists():
                found.append(int(suffix))
        return sorted(found)

    def check(self, banks: list[int]) -> None:
        """Raise a one-line :class:`UserError` naming the first missing file."""
        needed = [self.ca_cert, self.server_cert, self.server_key]
        needed += [p for b in banks for p in (self.bank_key(b), self.bank_public_key(b))]
        for path in needed:
            if not path.is_file():
                raise UserError(f"{path} is missing; run `fedfraud federation certs --out {self.root} "
                                f"--banks {max(banks) + 1 if banks else 1}` first")


def generate_federation_files(root: Path, banks: int, hosts: tuple[str, ...] = (LOOPBACK, "localhost"),
                              days: int = 365) -> FederationFiles:
    """A new CA, the SuperLink's certificate for ``hosts`` and one SuperNode key pair per bank, under ``root``.

    Existing files are replaced: new keys mean the old SuperNodes must be
    registered again.
    """
    if banks < 1:
        raise UserError("--banks must be at least 1")
    files = FederationFiles(Path(root))
    ca = CertificateAuthority.create("fedfraud federation CA", days=days)
    ca.write(files.ca_key, files.ca_cert)
    key, cert = ca.issue("fedfraud-superlink", hosts, days=days)
    write_private_key(files.server_key, key)
    write_certificate(files.server_cert, cert)
    for bank in range(banks):
        write_ssh_key_pair(files.bank_key(bank), files.bank_public_key(bank), f"fedfraud-bank-{bank}")
    logger.info("federation_certs root=%s banks=%d hosts=%s", files.root, banks, ",".join(hosts))
    return files


def _bin(name: str) -> str:
    """A Flower executable of this Python environment (falls back to ``$PATH``)."""
    here = Path(sys.executable).parent / name
    if here.exists():
        return str(here)
    found = shutil.which(name)
    if found is None:
        raise UserError(f"{name} not found next to {sys.executable} or on $PATH; install flwr")
    return found


def flwr_env(files: FederationFiles) -> dict[str, str]:
    """The environment for Flower processes: ``FLWR_HOME`` of this federation, this interpreter's bin first on PATH.

    The bin folder matters because the SuperLink and SuperNodes start
    ``flower-superexec`` and ``flwr-clientapp``/``flwr-serverapp`` by name.
    """
    env = dict(os.environ)
    env["FLWR_HOME"] = str(files.flwr_home)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _write_flower_config(files: FederationFiles, port: int) -> Path:
    files.flwr_home.mkdir(parents=True, exist_ok=True)
    path = files.flwr_home / "config.toml"
    path.write_text(
        f'[superlink]\ndefault = "{CONNECTION}"\n\n'
        f'[superlink.{CONNECTION}]\naddress = "{LOOPBACK}:{port}"\nroot-certificates = "{files.ca_cert.resolve()}"\n',
        encoding="utf-8",
    )
    return path


def _flwr(files: FederationFiles, *args: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_bin("flwr"), *args], env=flwr_env(files), capture_output=True, text=True,
                          timeout=timeout_s, check=False)


def _stop_trees(pids: list[int], timeout_s: float = 10.0) -> None:
    """SIGTERM each of ``pids`` and every descendant (Flower's SuperExec and app processes) at once, then
    SIGKILL what is still there after ``timeout_s``.
    """
    import psutil

    procs: list[psutil.Process] = []
    for pid in pids:
        try:
            root = psutil.Process(pid)
            procs += [*root.children(recursive=True), root]
        except psutil.NoSuchProcess:
            continue
    for proc in procs:
        try:
            proc.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=timeout_s)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=timeout_s)


@dataclass
class Federation:
    """A SuperLink (TLS + SuperNode authentication) and one SuperNode per bank, each its own process.

    Use as a context manager, or call :meth:`start` and :meth:`stop`.
    """

    files: FederationFiles
    data_dir: Path
    banks: list[int]
    port: int = 0
    cache: bool = True
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    node_ids: dict[int, str] = field(default_factory=dict)

    def __enter__(self) -> Federation:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def bank_dir(self, bank: int) -> Path:
        """The only data folder bank ``bank``'s SuperNode is given."""
        return Path(self.data_dir) / f"bank_{bank}"

    def _spawn(self, name: str, cmd: list[str]) -> subprocess.Popen[bytes]:
        self.files.logs.mkdir(parents=True, exist_ok=True)
        with open(self.files.logs / f"{name}.log", "wb") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=flwr_env(self.files),
                                    start_new_session=True)
        self.processes[name] = proc
        return proc

    def superlink_command(self) -> list[str]:
        """``flower-superlink`` serving TLS with the federation's certificate, admitting registered SuperNodes only."""
        f = self.files
        return [_bin("flower-superlink"), "--ssl-ca-certfile", str(f.ca_cert), "--ssl-certfile", str(f.server_cert),
                "--ssl-keyfile", str(f.server_key), "--enable-supernode-auth",
                "--disable-runtime-dependency-installation", "--host", LOOPBACK, "--port", str(self.port)]

    def supernode_command(self, bank: int, key: Path | None = None, insecure: bool = False,
                          max_retries: int | None = None) -> list[str]:
        """``flower-supernode`` of bank ``bank``: its own data folder, its own key, TLS verified against the CA."""
        node_config = f'partition-id={bank} data-dir="{self.bank_dir(bank).resolve()}"'
        if self.cache:
            node_config += f' cache-dir="{(self.files.root / "cache" / f"bank_{bank}").resolve()}"'
        cmd = [_bin("flower-supernode"), "--superlink", self.address, "--node-config", node_config,
               "--isolation", "subprocess", "--host", LOOPBACK, "--port", str(free_port())]
        cmd += ["--insecure"] if insecure else ["--root-certificates", str(self.files.ca_cert)]
        if key is not None:
            cmd += ["--auth-supernode-private-key", str(key)]
        if max_retries is not None:
            cmd += ["--max-retries", str(max_retries), "--max-wait-time", "30"]
        return cmd

    def register(self, public_key: Path, name: str) -> str:
        """Register a SuperNode public key with the SuperLink (``flwr supernode register``); returns its node id."""
        done = _flwr(self.files, "supernode", "register", str(public_key), CONNECTION, "--name", name,
                     "--format", "json")
        try:
            reply = json.loads(done.stdout[done.stdout.index("{"):])
        except ValueError:
            reply = {}
        if done.returncode != 0 or not reply.get("success"):
            raise RuntimeError(f"flwr supernode register {public_key} failed: {(done.stdout + done.stderr)[-400:]}")
        return str(reply["node-id"])

    def online_nodes(self) -> set[str]:
        """Node ids the SuperLink reports online (``flwr supernode list``)."""
        done = _flwr(self.files, "supernode", "list", CONNECTION, "--format", "json")
        try:
            nodes = json.loads(done.stdout[done.stdout.index("{"):]).get("nodes", [])
        except ValueError:
            return set()
        return {str(n["node-id"]) for n in nodes if n.get("status") == "online"}

    def start(self, timeout_s: float = 120.0) -> None:
        """Start the SuperLink, register every bank's key, start the SuperNodes; return once all are online."""
        self.files.check(self.banks)
        for bank in self.banks:
            if not (self.bank_dir(bank) / "transactions.parquet").exists():
                raise UserError(f"{self.bank_dir(bank)} holds no transactions.parquet")
        self.port = self.port or free_port()
        _write_flower_config(self.files, self.port)
        try:
            link = self._spawn("superlink", self.superlink_command())
            wait_for_port(self.port, link, "flower-superlink", timeout_s=60)
            for bank in self.banks:
                self.node_ids[bank] = self.register(self.files.bank_public_key(bank), f"bank-{bank}")
            for bank in self.banks:
                self._spawn(f"supernode-bank_{bank}", self.supernode_command(bank, self.files.bank_key(bank)))
            self._wait_online(timeout_s)
        except BaseException:
            self.stop()
            raise
        self._write_state()
        logger.info("federation_up address=%s banks=%s flwr_home=%s", self.address,
                    ",".join(map(str, self.banks)), self.files.flwr_home)

    def _wait_online(self, timeout_s: float) -> None:
        wanted = set(self.node_ids.values())
        deadline = time.monotonic() + timeout_s
        while True:
            for name, proc in self.processes.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with status {proc.returncode}; see {self.files.logs}/{name}.log")
            if wanted <= self.online_nodes():
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"SuperNodes not online within {timeout_s:.0f} s; see {self.files.logs}")
            time.sleep(0.5)

    def _write_state(self) -> None:
        state = {"address": self.address, "port": self.port, "banks": self.banks, "node_ids": self.node_ids,
                 "pids": {name: p.pid for name, p in self.processes.items()}, "flwr_home": str(self.files.flwr_home)}
        (self.files.root / STATE_FILE).write_text(json.dumps(state, indent=1), encoding="utf-8")

    def stop(self) -> None:
        """Stop the SuperLink and the SuperNodes, with the processes they started."""
        _stop_trees([p.pid for p in self.processes.values()])
        for proc in self.processes.values():
            proc.wait()
        self.processes.clear()
        (self.files.root / STATE_FILE).unlink(missing_ok=True)


def stop_federation(root: Path) -> list[str]:
    """Stop a federation that ``fedfraud federation up --detach`` left running under ``root``; returns what stopped."""
    state_path = Path(root) / STATE_FILE
    if not state_path.exists():
        raise UserError(f"no running federation under {root} ({STATE_FILE} is missing)")
    pids: dict[str, int] = json.loads(state_path.read_text(encoding="utf-8"))["pids"]
    _stop_trees([int(pid) for pid in pids.values() if _is_flower(int(pid))])
    state_path.unlink()
    return sorted(pids)


def _is_flower(pid: int) -> bool:
    """Whether ``pid`` is still a Flower process (a stale state file must not make us kill a reused pid)."""
    import psutil

    try:
        return any("flower-" in part for part in psutil.Process(pid).cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def run_app(files: FederationFiles, app_dir: Path, run_config: dict[str, Any], timeout_s: float = 900.0,
            log_name: str = "run") -> subprocess.CompletedProcess[str]:
    """``flwr run <app_dir> fedfraud --stream --run-config FILE``: submit an app and wait for it to finish.

    The log goes to ``logs/<log_name>.log`` too; a non-zero exit status raises RuntimeError.
    """
    def toml(value: Any) -> str:
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, str):
            return json.dumps(value)
        return repr(value)

    # a TOML file rather than 'k=v k=v': values such as a JSON FraudConfig hold spaces and quotes
    overrides = files.root / f"run-config-{log_name}.toml"
    overrides.write_text("".join(f"{k} = {toml(v)}\n" for k, v in run_config.items()), encoding="utf-8")
    cmd = [_bin("flwr"), "run", str(app_dir), CONNECTION, "--stream", "--run-config", str(overrides)]
    done = subprocess.run(cmd, env=flwr_env(files), capture_output=True, text=True, timeout=timeout_s, check=False)
    files.logs.mkdir(parents=True, exist_ok=True)
    (files.logs / f"{log_name}.log").write_text(done.stdout + done.stderr, encoding="utf-8")
    if done.returncode != 0:
        tail = (done.stdout + done.stderr)[-800:]
        raise RuntimeError(f"flwr run {app_dir} failed with status {done.returncode}: {tail}")
    return done
