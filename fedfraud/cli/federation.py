"""``fedfraud federation certs|up|features|ledger|down``: a Flower Deployment Engine federation of N banks here."""

from __future__ import annotations

import logging
import signal
import time
from pathlib import Path
from typing import Annotated

import typer

from fedfraud.cli.common import config_of, existing_dir
from fedfraud.core.errors import UserError

__all__ = ["federation_app", "register"]

log = logging.getLogger(__name__)

federation_app = typer.Typer(
    name="federation",
    help="A SuperLink and one SuperNode per bank as processes (TLS, SuperNode keys); see docs/deploy.md.",
    no_args_is_help=True,
)

OutOption = Annotated[Path, typer.Option("--out", help="federation folder: certs/, keys/, flwr/, logs/")]


@federation_app.command("certs")
def certs(
    out: OutOption = Path("out/federation"),
    banks: Annotated[int, typer.Option("--banks", help="number of banks: one SuperNode key pair each")] = 3,
    host: Annotated[
        list[str] | None,
        typer.Option("--host", help="name or IP the SuperLink certificate is valid for (repeat; default: "
                                    "127.0.0.1 and localhost)"),
    ] = None,
    days: Annotated[int, typer.Option("--days", help="validity of the CA and the certificate")] = 365,
) -> None:
    """Generate the federation's TLS material: a CA, the SuperLink's certificate, one auth key pair per bank."""
    from fedfraud.training.federated.deployment import generate_federation_files

    if days < 1:
        raise UserError("--days must be at least 1")
    files = generate_federation_files(out, banks, tuple(host or ["127.0.0.1", "localhost"]), days)
    typer.echo(f"CA:                {files.ca_cert}  (key {files.ca_key}: keep it with the operator)")
    typer.echo(f"SuperLink TLS:     {files.server_cert}, {files.server_key}")
    typer.echo(f"SuperNode keys:    {files.root / 'keys'}/bank_<k> (private, stays at bank k) and bank_<k>.pub")


@federation_app.command("up")
def up(
    ctx: typer.Context,
    data_dir: Annotated[Path, typer.Option("--data-dir", help="dataset root holding bank_<k>/ folders")],
    out: OutOption = Path("out/federation"),
    banks: Annotated[int, typer.Option("--banks", help="start SuperNodes for banks 0..N-1")] = 3,
    port: Annotated[int, typer.Option("--port", help="SuperLink port (Fleet, Control and ServerAppIO over HTTPS); "
                                                     "0 = a free one")] = 0,
    detach: Annotated[
        bool, typer.Option("--detach", help="return once all SuperNodes are online; stop with `federation down`")
    ] = False,
) -> None:
    """Start a SuperLink (TLS + SuperNode authentication) and one SuperNode per bank, each on its own folder."""
    from fedfraud.training.federated.deployment import Federation, FederationFiles

    config_of(ctx, needs_secret=True)  # the SuperNodes' ClientApps key features with it (they inherit it)
    existing_dir(data_dir, "data directory")
    if banks < 1:
        raise UserError("--banks must be at least 1")
    files = FederationFiles(out)
    fed = Federation(files, data_dir, list(range(banks)), port=port)
    fed.start()
    typer.echo(f"SuperLink on https://{fed.address} with {banks} SuperNodes online (logs in {files.logs}).")
    typer.echo("Run the apps against it:")
    typer.echo(f'  FLWR_HOME={files.flwr_home} flwr run . fedfraud --stream --run-config "num-banks={banks} rounds=5"')
    typer.echo(f'  FLWR_HOME={files.flwr_home} flwr run apps/fraud fedfraud --stream --run-config '
               f'"num-supernodes={banks} num-rounds=20"')
    typer.echo(f'  FLWR_HOME={files.flwr_home} flwr run apps/anomaly_dp fedfraud --stream --run-config '
               f'"num-banks={banks} dp-cardholders=<N>"   (cardholder-level DP under SecAgg+; docs/deploy.md)')
    if detach:
        fed.processes.clear()  # leave them running; `federation down` stops them from federation.json
        typer.echo(f"Stop it with: fedfraud federation down --out {out}")
        return
    typer.echo("Ctrl-C stops the federation.")
    stop = {"now": False}

    def _stop(*_: object) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, _stop)
    try:
        while not stop["now"]:
            for name, proc in fed.processes.items():
                if proc.poll() is not None:
                    raise UserError(f"{name} exited with status {proc.returncode}; see {files.logs}/{name}.log")
            time.sleep(1.0)
    except KeyboardInterrupt:
        pass
    finally:
        fed.stop()
        typer.echo("federation stopped")


@federation_app.command("features")
def features(
    ctx: typer.Context,
    data_dir: Annotated[Path, typer.Option("--data-dir", help="dataset root holding this bank's bank_<k>/ folder")],
    bank: Annotated[int, typer.Option("--bank", min=0, help="this bank's partition id k")],
    registry: Annotated[
        Path | None, typer.Option("--registry", help="add the published anomaly model's score (the AS column)")
    ] = None,
) -> None:
    """Write this bank's fraud features to ``bank_<k>/fraud-features.npz``, what its SuperNode's fraud ClientApp
    trains on. Each bank runs it on its own data; nothing leaves the bank.
    """
    from fedfraud.feature_store.layout import bank_dir
    from fedfraud.training.anomaly.scorer import AnomalyScorer
    from fedfraud.training.fraud.dataset import bank_features
    from fedfraud.training.fraud.federated.task import NODE_FEATURES_FILE

    cfg = config_of(ctx, needs_secret=True)
    existing_dir(data_dir, "data directory")
    scorer = AnomalyScorer.from_registry(registry) if registry is not None else None
    tag = scorer.tag if scorer is not None else "none"
    feats = bank_features(data_dir, bank, cfg.fraud, cfg.encoder, cfg.privacy, scorer)
    out = bank_dir(data_dir, bank) / NODE_FEATURES_FILE
    feats.save(str(out))
    typer.echo(f"wrote {out}: {len(feats)} rows, anomaly score from {tag}")


@federation_app.command("ledger")
def ledger(
    data_dir: Annotated[Path, typer.Option("--data-dir", help="dataset root holding this bank's bank_<k>/ folder")],
    bank: Annotated[int, typer.Option("--bank", min=0, help="this bank's partition id k")],
    path: Annotated[Path | None, typer.Option("--ledger", help="the ledger file, when the SuperNode's node "
                                                               "config named one (dp-ledger)")] = None,
) -> None:
    """This bank's privacy ledger: every DP run it answered, and their composed (ε, δ) per cardholder."""
    from fedfraud.feature_store.layout import bank_dir
    from fedfraud.training.federated.ledger import PrivacyLedger

    where = path or bank_dir(data_dir, bank) / "dp-ledger.json"
    if not where.is_file():
        raise UserError(f"no privacy ledger at {where}: this bank has answered no DP run there")
    book = PrivacyLedger(where)
    entries = book.entries()
    for e in entries:
        typer.echo(f"{e.charged_at}  {e.run}  ε {e.epsilon:.4g} at δ {e.delta:g}  ({e.mechanism})")
    eps, delta = book.composed(entries)
    typer.echo(f"composed over {len(entries)} run(s): ε {eps:.4g} at δ {delta:g} per cardholder")


@federation_app.command("down")
def down(out: OutOption = Path("out/federation")) -> None:
    """Stop a federation that `federation up --detach` left running under ``--out``."""
    from fedfraud.training.federated.deployment import stop_federation

    stopped = stop_federation(out)
    typer.echo(f"stopped {', '.join(stopped)}")


def register(app: typer.Typer) -> None:
    """Add the ``federation`` group to the root CLI."""
    app.add_typer(federation_app)
