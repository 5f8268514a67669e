"""Histogram-based horizontal federated XGBoost: the trees a centralized model would build, rows stay in banks.

One ``xgboost.federated`` server and one worker **process** per bank
(``python -m fedfraud.training.fraud.federated.hist worker SPEC``). Each worker loads
only its own bank's feature file and trains inside
``xgboost.collective.CommunicatorContext(dmlc_communicator="federated", ...)``
with ``tree_method="hist"``; XGBoost's collective then sums, across banks,
what a centralized ``hist`` model computes from all rows:

* the quantile sketch of every feature (once per model): each bank sends a
  weighted summary of its feature values, the merged sketch gives the global
  bin boundaries ("cuts"), which every bank receives;
* per tree node to be split: the gradient / hessian sum of every (feature,
  bin) pair of the node's rows (``GradientPairPrecise``: 2 doubles per bin),
  plus the node's total gradient / hessian; the sum over banks is the
  histogram a centralized model builds, so every bank evaluates the same
  split gains and grows the same tree;
* small control values (row counts for the base margin, tree-method checks).

Our code adds two sums through the same collective: the global count of
fraud / legit training rows (so ``scale_pos_weight`` is the pooled neg/pos,
as centralized) and, after training, the banks' validation score histograms
(positives and negatives, ``threshold_bins`` bins) for the max-F1 threshold.

What that reveals: the cuts are quantiles of each feature over all banks
(an approximate distribution of every feature, incl. the amount). A node's
per-bin gradient sums are, at the root of the first tree with base score 0.5,
``Σ w (0.5 − y)`` over the bank's rows in the bin: with the hessian sums
(``Σ 0.25 w``) they give the bank's count of rows and of frauds per
(feature, bin) pair, and deeper nodes give the same per conjunction of splits.
A bin holding one row of a bank reveals that row's label. Nothing sends a
row, a cardholder id or a per-row gradient, but the aggregates are in clear
to the server (no secure aggregation, no DP noise); TLS protects them only on
the wire. See docs/fraud.md.

Why processes, not threads or a ``multiprocessing`` queue: the collective is
process-global state in libxgboost, and a queue-based attempt hung
(DESIGN.md §5). Results come back as files; every wait has a timeout.

The server always speaks mutual TLS. libxgboost 3.2 binds it to ``0.0.0.0:PORT``
(``plugin/federated/federated_tracker.cc`` hard-codes the address; neither
``run_federated_server`` nor the tracker's JSON config takes a host), so it is
reachable from the network whatever we ask, and a plaintext server there would
let anyone read the histograms or join as a bank. With ``tls=False`` the banks
speak plaintext only to :class:`_TlsBridge`, a relay bound to 127.0.0.1 that
carries their bytes to the server over mutual TLS: what the wire tests and the
attack bench record on loopback, and nothing in clear beyond it. The server
process itself refuses to start without its certificates.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedfraud.core.net import LOOPBACK, free_port, wait_for_port
from fedfraud.training.fraud.config import FraudConfig
from fedfraud.training.fraud.features import ANOMALY_FEATURE, FraudFeatures
from fedfraud.training.fraud.model import FraudModel, xgb_params

__all__ = ["HistJob", "TlsFiles", "federated_hist_train", "make_tls_files"]

logger = logging.getLogger(__name__)

_REPO_ROOT = Path(__file__).resolve().parents[3]


@dataclass(frozen=True)
class HistJob:
    """One model to train federated: a name, whether it uses an AS column (and which), and its seed.

    ``as_key`` names an entry of ``extra_columns`` given to :func:`federated_hist_train`
    (the stacked score); ``None`` trains without the anomaly-score column. ``drop``
    leaves further features out (the ablated base of the positive control).
    """

    name: str
    as_key: str | None = None
    seed: int = 7
    drop: tuple[str, ...] = ()


@dataclass(frozen=True)
class TlsFiles:
    """PEM files of a throwaway mutual-TLS setup: the server's key/cert and the banks' client key/cert."""

    server_key: Path
    server_cert: Path
    client_key: Path
    client_cert: Path


def make_tls_files(folder: Path, host: str = "localhost") -> TlsFiles:
    """Self-signed server and client certificates (``cryptography``), valid one day, for one run.

    Each certificate is its own trust anchor: the server trusts the client cert, the banks trust
    the server cert. A deployment would use the consortium's CA instead.
    """
    from fedfraud.core.pki import self_signed, write_certificate, write_private_key

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)

    def one(name: str) -> tuple[Path, Path]:
        key, cert = self_signed(host if name == "server" else f"fedfraud-{name}", (host, "127.0.0.1"))
        key_path, cert_path = folder / f"{name}.key", folder / f"{name}.pem"
        write_private_key(key_path, key)
        write_certificate(cert_path, cert)
        return key_path, cert_path

    server_key, server_cert = one("server")
    client_key, client_cert = one("client")
    return TlsFiles(server_key, server_cert, client_key, client_cert)


class _TlsBridge:
    """``127.0.0.1:port`` in plaintext → the federated server's mutual-TLS port, for workers on this machine.

    Why: the server listens on every interface (see the module docstring), so it must not speak plaintext; a
    session that wants the banks' plaintext on the wire (``tls=False``: the wire tests, the attack bench) gets it
    on loopback only. One asyncio loop in a daemon thread relays every connection (TLS objects stay on one
    thread); gRPC's HTTP/2 frames are the same over TLS (ALPN ``h2``) as in clear.
    """

    def __init__(self, port: int, server_port: int, files: TlsFiles) -> None:
        self.port, self.server_port = port, server_port
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(files.server_cert))
        ctx.load_cert_chain(str(files.client_cert), str(files.client_key))
        ctx.set_alpn_protocols(["h2"])
        self._ctx = ctx
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"xgb-tls-bridge-{port}", daemon=True)

    def start(self) -> _TlsBridge:
        """Listen on ``127.0.0.1:port``; raises what binding raised."""
        self._thread.start()
        self._started.wait(timeout=10)
        if self._error is not None:
            raise self._error
        return self

    def close(self) -> None:
        """Stop accepting and drop every relayed connection."""
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            server = self._loop.run_until_complete(asyncio.start_server(self._relay, LOOPBACK, self.port))
        except BaseException as exc:  # noqa: BLE001 - handed to start()
            self._error = exc
            self._started.set()
            return
        self._started.set()
        try:
            self._loop.run_forever()
        finally:
            server.close()
            pending = asyncio.all_tasks(self._loop)
            for task in pending:
                task.cancel()
            self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self._loop.close()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(LOOPBACK, self.server_port, ssl=self._ctx,
                                                                 server_hostname="localhost")
        except (OSError, ssl.SSLError) as exc:  # the worker's gRPC client retries
            logger.debug("TLS bridge: server not reachable (%s)", exc)
            writer.close()
            return
        await asyncio.gather(_pump(reader, up_writer), _pump(up_reader, writer))


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy ``reader`` to ``writer`` until either side closes."""
    try:
        while chunk := await reader.read(1 << 16):
            writer.write(chunk)
            await writer.drain()
    except (OSError, ssl.SSLError):
        pass
    finally:
        writer.close()


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(_REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _kill(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - a process that ignores SIGKILL
            logger.warning("process %d did not exit after kill", p.pid)


def _tail(path: Path, n: int = 2000) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")[-n:]
    except OSError:
        return ""


def federated_hist_train(
    banks: Mapping[int, FraudFeatures],
    cfg: FraudConfig,
    jobs: Sequence[HistJob],
    *,
    extra_columns: Mapping[str, Mapping[int, np.ndarray]] | None = None,
    tls: bool = True,
    timeout_s: float = 1800.0,
    rounds: int | None = None,
    max_bin: int | None = None,
    worker_address: Mapping[int, str] | None = None,
    port: int | None = None,
    workdir: Path | None = None,
) -> dict[str, FraudModel]:
    """Train every job with histogram federation across ``banks``; one worker process per bank.

    Args:
        banks: each bank's features (train / valid / test split inside).
        cfg: XGBoost settings (same as the centralized model) and threshold bins.
        jobs: the models to train, in one federation session (process start-up paid once).
        extra_columns: ``key → bank → values`` (one per row of that bank): alternative AS columns.
        tls: mutual TLS between banks and server with throwaway certificates. False: the banks speak plaintext
            to a relay on 127.0.0.1 that carries it to the server over mutual TLS (the server, which libxgboost
            binds to every interface, never speaks plaintext).
        timeout_s: wall-clock limit of the whole session; on expiry every process is killed.
        rounds: boosting rounds (default ``cfg.num_boost_round``, the centralized model's).
        max_bin: XGBoost ``max_bin`` (default 256).
        worker_address: per rank, the address a worker dials instead of the server's (a test proxy).
        port: the port the banks dial (default: a free one): the server's, or with ``tls=False`` the relay's.
        workdir: keep the session's files here instead of a temporary folder.

    Returns:
        job name → :class:`FraudModel` (variant ``federated``), identical on every bank (checked).
    """
    if len(banks) < 2:
        raise ValueError("federated training needs at least 2 banks")
    if not jobs or len({j.name for j in jobs}) != len(jobs):
        raise ValueError("jobs must be non-empty with distinct names")
    extra_columns = extra_columns or {}
    for job in jobs:
        if job.as_key is not None and job.as_key not in extra_columns:
            raise ValueError(f"job {job.name!r} wants AS column {job.as_key!r}, not in extra_columns")
    order = sorted(banks)
    names = banks[order[0]].names
    rounds = cfg.num_boost_round if rounds is None else rounds
    with tempfile.TemporaryDirectory(prefix="fedfraud-hist-") as tmp:
        folder = Path(workdir) if workdir is not None else Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for rank, b in enumerate(order):
            data = banks[b]
            arrays = {"X": data.X, "label": data.label, "split": data.split.astype(str),
                      "names": np.asarray(data.names)}
            for key, per_bank in extra_columns.items():
                col = np.asarray(per_bank[b], dtype=np.float32)
                if col.shape != (len(data),):
                    raise ValueError(f"extra column {key!r} of bank {b} has shape {col.shape}, need ({len(data)},)")
                arrays[f"col_{key}"] = col
            np.savez(folder / f"rank_{rank}.npz", **arrays)
        files = make_tls_files(folder / "tls")  # always: the server listens on every interface
        port = free_port() if port is None else port
        server_port = port if tls else free_port()
        params = xgb_params(cfg, 1.0)
        params["nthread"] = 1
        if max_bin is not None:
            params["max_bin"] = int(max_bin)
        started = time.perf_counter()
        server_log = folder / "server.log"
        server_cmd = [sys.executable, "-m", "fedfraud.training.fraud.federated.hist", "server",
                      "--port", str(server_port), "--world", str(len(order)), "--timeout", str(int(timeout_s)),
                      "--server-key", str(files.server_key), "--server-cert", str(files.server_cert),
                      "--client-cert", str(files.client_cert)]
        procs: list[subprocess.Popen[bytes]] = []
        logs: list[Path] = []
        bridge: _TlsBridge | None = None
        try:
            with server_log.open("wb") as fh:
                server = subprocess.Popen(server_cmd, stdout=fh, stderr=subprocess.STDOUT, env=_child_env(),
                                          cwd=str(_REPO_ROOT))
            procs.append(server)
            wait_for_port(server_port, server, "federated XGBoost server", timeout_s=min(60.0, timeout_s))
            if not tls:
                bridge = _TlsBridge(port, server_port, files).start()
            for rank in range(len(order)):
                spec = {
                    "rank": rank, "world": len(order),
                    "address": (worker_address or {}).get(rank, f"localhost:{port}" if tls else f"{LOOPBACK}:{port}"),
                    "data": str(folder / f"rank_{rank}.npz"), "out": str(folder), "params": params,
                    "rounds": rounds, "cap": cfg.max_scale_pos_weight, "bins": cfg.threshold_bins,
                    "jobs": [{"name": j.name, "as_key": j.as_key, "seed": j.seed, "drop": list(j.drop)} for j in jobs],
                    "tls": None if not tls else {"server_cert": str(files.server_cert),
                                                 "client_key": str(files.client_key),
                                                 "client_cert": str(files.client_cert)},
                }
                spec_path = folder / f"rank_{rank}.spec.json"
                spec_path.write_text(json.dumps(spec), encoding="utf-8")
                log = folder / f"rank_{rank}.log"
                logs.append(log)
                with log.open("wb") as fh:
                    procs.append(subprocess.Popen(
                        [sys.executable, "-m", "fedfraud.training.fraud.federated.hist", "worker", str(spec_path)],
                        stdout=fh, stderr=subprocess.STDOUT, env=_child_env(), cwd=str(_REPO_ROOT)))
            deadline = time.monotonic() + timeout_s
            for rank, proc in enumerate(procs[1:]):
                left = max(deadline - time.monotonic(), 0.1)
                try:
                    code = proc.wait(timeout=left)
                except subprocess.TimeoutExpired:
                    raise TimeoutError(f"federated XGBoost worker {rank} did not finish within {timeout_s:.0f} s; "
                                       f"log tail: {_tail(logs[rank])}") from None
                if code != 0:
                    raise RuntimeError(f"federated XGBoost worker {rank} (bank {order[rank]}) exited with {code}: "
                                       f"{_tail(logs[rank])}")
            try:
                server.wait(timeout=2)
            except subprocess.TimeoutExpired:
                logger.debug("federated server still running after the workers finished; stopping it")
        finally:
            _kill(procs)
            if bridge is not None:
                bridge.close()
        wall = time.perf_counter() - started
        return _collect(folder, order, names, jobs, wall, rounds, tls)


def _collect(folder: Path, order: list[int], names: tuple[str, ...], jobs: Sequence[HistJob], wall: float,
             rounds: int, tls: bool) -> dict[str, FraudModel]:
    import xgboost as xgb

    models: dict[str, FraudModel] = {}
    for job in jobs:
        raw = [(folder / f"rank_{r}.{job.name}.json").read_bytes() for r in range(len(order))]
        info = json.loads((folder / f"rank_0.{job.name}.info.json").read_text(encoding="utf-8"))
        booster = xgb.Booster()
        booster.load_model(bytearray(raw[0]))
        booster.set_param({"nthread": 1})
        # every bank grew the same trees from the same summed histograms: check rather than assume
        reference = booster.get_dump()
        for r in range(1, len(order)):
            other = xgb.Booster()
            other.load_model(bytearray(raw[r]))
            if other.get_dump() != reference:
                raise RuntimeError(f"job {job.name}: bank rank {r} holds different trees than rank 0")
        used = tuple(n for n in names if n not in job.drop and (job.as_key is not None or n != ANOMALY_FEATURE))
        models[job.name] = FraudModel(
            booster, names, used, float(info["threshold"]), "federated",
            {"banks": order, "rounds": rounds, "protocol": "xgboost-federated-hist", "tls": tls,
             "valid_f1": info["valid_f1"], "scale_pos_weight": info["scale_pos_weight"],
             "session_seconds": wall, "as_key": job.as_key, "seed": job.seed, "dropped": list(job.drop)},
        )
    logger.info("fraud_federated_hist banks=%d jobs=%d rounds=%d tls=%s wall_s=%.1f", len(order), len(jobs),
                rounds, tls, wall)
    return models


# ---------------------------------------------------------------------------- the processes
def _worker(spec_path: Path) -> None:
    """One bank: join the federation, train every job on its own rows, write the model and threshold."""
    import xgboost as xgb
    from xgboost import collective

    from fedfraud.training.fraud.metrics import score_histograms, threshold_from_histograms

    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    rank, out = int(spec["rank"]), Path(spec["out"])
    with np.load(spec["data"], allow_pickle=False) as z:
        X, label, split = z["X"], z["label"], z["split"].astype(object)
        names = tuple(z["names"].tolist())
        extra = {k[len("col_"):]: z[k] for k in z.files if k.startswith("col_")}
    as_idx = names.index(ANOMALY_FEATURE)
    comm: dict[str, Any] = {
        "dmlc_communicator": "federated", "federated_server_address": spec["address"],
        "federated_world_size": int(spec["world"]), "federated_rank": rank,
    }
    if spec["tls"]:
        comm.update({"federated_server_cert_path": spec["tls"]["server_cert"],
                     "federated_client_key_path": spec["tls"]["client_key"],
                     "federated_client_cert_path": spec["tls"]["client_cert"]})
    train, valid = split == "train", split == "valid"
    with collective.CommunicatorContext(**comm):
        for job in spec["jobs"]:
            Xj = X.copy()
            if job["as_key"] is not None:
                Xj[:, as_idx] = extra[job["as_key"]]
            keep = [i for i, n in enumerate(names)
                    if n not in job["drop"] and (job["as_key"] is not None or i != as_idx)]
            Xj = Xj[:, keep]
            used = [names[i] for i in keep]
            y = label[train]
            counts = collective.allreduce(np.asarray([np.sum(y == 1), np.sum(y == 0)], dtype=np.float64),
                                          collective.Op.SUM)
            pos, neg = float(counts[0]), float(counts[1])
            spw = 1.0 if pos == 0 else float(min(max(neg / pos, 1.0), float(spec["cap"])))
            params = {**spec["params"], "scale_pos_weight": spw, "seed": int(job["seed"])}
            dtrain = xgb.DMatrix(Xj[train], label=y, feature_names=used, missing=np.nan, nthread=1)
            booster = xgb.train(params, dtrain, num_boost_round=int(spec["rounds"]))
            scores = booster.predict(xgb.DMatrix(Xj[valid], feature_names=used, missing=np.nan, nthread=1))
            p_hist, n_hist = score_histograms(label[valid], scores, int(spec["bins"]))
            summed = collective.allreduce(np.concatenate([p_hist, n_hist]).astype(np.int64), collective.Op.SUM)
            bins = int(spec["bins"])
            threshold, f1 = threshold_from_histograms(summed[:bins], summed[bins:])
            booster.save_model(str(out / f"rank_{rank}.{job['name']}.json"))
            # the bin boundaries every bank used (from the merged sketch the server relayed): what the per-bin
            # sums it sent mean, kept for the attack bench (fedfraud.bench.attacks)
            indptr, cut_values = dtrain.get_quantile_cut()
            np.savez(out / f"rank_{rank}.{job['name']}.cuts.npz", indptr=indptr, values=cut_values,
                     names=np.asarray(used))
            (out / f"rank_{rank}.{job['name']}.info.json").write_text(json.dumps({
                "threshold": threshold, "valid_f1": f1, "scale_pos_weight": spw, "train_rows": int(train.sum()),
            }), encoding="utf-8")


def _server(args: argparse.Namespace) -> None:
    """The aggregation server: mutual TLS only (libxgboost binds it to every interface, see the module docstring)."""
    from xgboost import federated

    federated.run_federated_server(
        n_workers=args.world, port=args.port, server_key_path=args.server_key, server_cert_path=args.server_cert,
        client_cert_path=args.client_cert, timeout=args.timeout,
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point of the server and worker processes (not a user command)."""
    parser = argparse.ArgumentParser(prog="python -m fedfraud.training.fraud.federated.hist")
    sub = parser.add_subparsers(dest="role", required=True)
    s = sub.add_parser("server")
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--world", type=int, required=True)
    s.add_argument("--timeout", type=int, default=1800)
    s.add_argument("--server-key")
    s.add_argument("--server-cert")
    s.add_argument("--client-cert")
    w = sub.add_parser("worker")
    w.add_argument("spec", type=Path)
    args = parser.parse_args(argv)
    if args.role == "server" and not (args.server_key and args.server_cert and args.client_cert):
        parser.error("the server needs --server-key, --server-cert and --client-cert: libxgboost binds it to "
                     "0.0.0.0, so it never runs in plaintext")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if args.role == "server":
        _server(args)
    else:
        _worker(args.spec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
