"""``fedfraud train``: model training commands (``train anomaly``, ``train fraud``).

To add a model, write ``@train_app.command("name")`` below and import the
trainer inside the function so ``--help`` stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import click
import typer

from fedfraud.cli.common import config_of, existing_dir
from fedfraud.config import update_section

__all__ = ["register", "train_app"]

train_app = typer.Typer(
    name="train", help="Train models (federated on Flower/Ray, or centralized).", no_args_is_help=True
)


@train_app.command("anomaly")
def anomaly(
    ctx: typer.Context,
    data: Annotated[Path, typer.Option("--data", help="dataset directory with bank_<k>/transactions.parquet")],
    out: Annotated[
        Path, typer.Option("--out", help="artifacts dir: registry root; checkpoints under checkpoints/")
    ] = Path("artifacts"),
    pooling: Annotated[
        str | None,
        typer.Option(
            "--pooling",
            # not listed here: reading the operators' registry imports torch, and --help stays fast
            help="a registered pooling operator (topk, asap, ...); an unknown name lists all",
        ),
    ] = None,
    rounds: Annotated[int | None, typer.Option("--rounds", min=1, help="federated rounds")] = None,
    local_epochs: Annotated[int | None, typer.Option("--local-epochs", min=1, help="local epochs per round")] = None,
    samples_per_epoch: Annotated[
        int | None, typer.Option("--samples-per-epoch", min=1, help="real pairs per local epoch (CPU budget knob)")
    ] = None,
    proximal_mu: Annotated[float | None, typer.Option("--proximal-mu", min=0.0, help="FedProx μ")] = None,
    epsilon_max: Annotated[
        float | None, typer.Option("--epsilon-max", help="ε_max of the cardholders' U(ε_min, ε_max)")
    ] = None,
    centralized: Annotated[
        bool, typer.Option("--centralized", help="train on all banks in one process (upper bound)")
    ] = False,
    resume: Annotated[bool, typer.Option("--resume", help="continue from the last checkpoint under --out")] = False,
    banks_cpus: Annotated[float | None, typer.Option("--banks-cpus", help="CPUs Ray reserves per bank client")] = None,
    banks_gpus: Annotated[float | None, typer.Option("--banks-gpus", help="GPUs per bank client (-1: auto)")] = None,
    ray_cpus: Annotated[int | None, typer.Option("--ray-cpus", min=1, help="CPUs of the local Ray instance")] = None,
) -> None:
    """Train the anomaly GNN (FedProx over the banks by default) and publish it to the registry under --out."""
    from fedfraud.training.anomaly.federated.task import RunSettings

    cfg = config_of(ctx, needs_secret=True)
    existing_dir(data, "data directory")
    cfg = update_section(
        cfg, "anomaly", pooling=pooling, local_epochs=local_epochs, samples_per_epoch=samples_per_epoch
    )
    cfg = update_section(
        cfg,
        "federated",
        rounds=rounds,
        proximal_mu=proximal_mu,
        client_cpus=banks_cpus,
        client_gpus=banks_gpus,
        ray_cpus=ray_cpus,
    )
    cfg = update_section(cfg, "privacy", epsilon_max=epsilon_max)
    settings = RunSettings.from_config(cfg, data, out, resume=resume)
    if centralized:
        from fedfraud.training.anomaly.centralized import run_centralized

        result = run_centralized(settings)
    else:
        from fedfraud.training.anomaly.federated.trainer import run_federated

        result = run_federated(settings)
    s = result.summary
    typer.echo(
        f"mode={result.mode} rounds={result.rounds} banks={result.banks} wall_seconds={result.wall_seconds:.1f} "
        f"f1={s.get('f1_mean', float('nan')):.4f} roc_auc={s.get('roc_auc_mean', float('nan')):.4f} "
        f"fraud_roc_auc={s.get('fraud_roc_auc_mean', float('nan')):.4f} "
        f"fraud_pr_auc={s.get('fraud_pr_auc_mean', float('nan')):.4f} published={result.version}"
    )


@train_app.command("fraud")
def fraud(
    ctx: typer.Context,
    data: Annotated[Path, typer.Option("--data", help="dataset directory (bank_<k>/...) or a Sparkov/TabFormer CSV")],
    out: Annotated[Path, typer.Option("--out", help="registry root; the anomaly model is read from here too")] = Path(
        "artifacts"
    ),
    variant: Annotated[
        str | None, typer.Option("--variant", help="federated: histogram federation (default: fraud.variant); "
                                 "fedavg-gnn / fedrpda: the federated GNN, published as kind fraud-gnn; fed-spfd: "
                                 "heterogeneous banks (`banks.<k>.private_features`), --bank's model published as "
                                 "kind fraud-spfd; federated-dp: cardholder-level DP (random trees, noised leaf sums, "
                                 "SecAgg+ arithmetic replayed in process, `fraud.dp`)",
                                 click_type=click.Choice(["federated", "federated-bagging", "federated-dp",
                                                          "centralized", "local", "fedavg-gnn", "fedrpda",
                                                          "fed-spfd"]))
    ] = None,
    bank: Annotated[
        int, typer.Option("--bank", help="which bank's model to publish with --variant local or fed-spfd")
    ] = 0,
    no_anomaly_score: Annotated[bool, typer.Option("--no-anomaly-score", help="train without the AS feature")] = False,
    features: Annotated[
        str | None, typer.Option("--features", click_type=click.Choice(["+hin2vec"]),
                                 help="+hin2vec: append the G-HIN2Vec embedding columns (`train embeddings` first)")
    ] = None,
    rounds: Annotated[
        int | None, typer.Option("--rounds", min=1, help="FedXgbBagging rounds (--variant federated-bagging)")
    ] = None,
) -> None:
    """Train the XGBoost fraud model on fraud features + the federated anomaly score and publish it (kind fraud)."""
    from fedfraud.training.fraud.pipeline import train_and_publish

    cfg = update_section(
        config_of(ctx, needs_secret=True),
        "fraud",
        variant=variant,
        federated_rounds=rounds,
        use_anomaly_score=False if no_anomaly_score else None,
        extra_features=("hin2vec",) if features else None,
    )
    version, metrics = train_and_publish(cfg, data, out, bank=bank)
    typer.echo(
        f"published {version.tag} variant={cfg.fraud.variant} anomaly_score={cfg.fraud.use_anomaly_score} "
        + " ".join(f"{k}={v:.4f}" for k, v in metrics.items() if isinstance(v, float))
    )


def register(app: typer.Typer) -> None:
    """Attach the ``train`` group to the root CLI."""
    app.add_typer(train_app, name="train")
