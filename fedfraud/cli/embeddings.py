"""``fedfraud train embeddings``: federated, unsupervised cardholder embeddings (``--method g-hin2vec``).

Mounted on the ``train`` group of :mod:`fedfraud.cli.train` from here (``register`` adds the command to that
group's Typer), so the group's module needs no change.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import click
import typer

from fedfraud.cli.common import config_of, existing_dir

__all__ = ["embeddings", "register"]


def embeddings(
    ctx: typer.Context,
    data: Annotated[Path, typer.Option("--data", help="dataset directory with bank_<k>/transactions.parquet")],
    out: Annotated[Path, typer.Option("--out", help="registry root: publishes kind hin2vec")] = Path("artifacts"),
    method: Annotated[
        str, typer.Option("--method", help="embedding method", click_type=click.Choice(["g-hin2vec"]))
    ] = "g-hin2vec",
    rounds: Annotated[int | None, typer.Option("--rounds", min=1, help="federated rounds (FedAvg)")] = None,
    local_epochs: Annotated[int | None, typer.Option("--local-epochs", min=1, help="local epochs per round")] = None,
    dim: Annotated[int | None, typer.Option("--dim", min=2, help="embedding size")] = None,
    ray_cpus: Annotated[int, typer.Option("--ray-cpus", min=1, help="CPUs of the local Ray instance")] = 2,
) -> None:
    """Train G-HIN2Vec (thesis ch. 3) federated over the banks with Flower and publish it as kind hin2vec."""
    from fedfraud.training.embeddings.trainer import train_embeddings

    del method  # one method today; the option names it so a second one has a place
    cfg = config_of(ctx, needs_secret=True)
    existing_dir(data, "data directory")
    changes = {k: v for k, v in (("rounds", rounds), ("local_epochs", local_epochs), ("dim", dim)) if v is not None}
    h = cfg.hin2vec.model_copy(update=changes)
    result = train_embeddings(data, out, h, cfg.encoder, cfg.privacy, cfg.egograph, num_cpus=ray_cpus)
    ev = result["evaluate"].get(str(h.rounds), {})
    typer.echo(f"published {result.get('version')} rounds={h.rounds} banks={result['banks']} "
               f"wall_seconds={result['wall_seconds_total']:.1f} test_loss={ev.get('test-loss', float('nan')):.4f} "
               f"test_node_acc={ev.get('test-node-acc', float('nan')):.3f} "
               f"test_path_acc={ev.get('test-path-acc', float('nan')):.3f}")


def register(app: typer.Typer) -> None:
    """Add ``embeddings`` to the ``train`` group (``fedfraud train embeddings``)."""
    del app
    from fedfraud.cli.train import train_app

    if not any(c.name == "embeddings" for c in train_app.registered_commands):
        train_app.command("embeddings")(embeddings)
