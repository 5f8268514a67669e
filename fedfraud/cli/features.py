"""``fedfraud features``: build, apply, materialize and inspect the Feast feature store.

``apply`` renders the Feast repo for the chosen online-store profile into
``features.repo_dir`` (``feature_store.yaml`` + ``definitions.py`` + ``data/``),
writes the offline parquet from a dataset (each bank featurised with its own
secret) and runs ``feast apply``; ``materialize`` loads the latest offline rows
into the online store; ``get`` prints one cardholder's online features.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import click
import typer

from fedfraud.config import update_section
from fedfraud.cli.common import config_of, existing_dir

__all__ = ["features_app", "register"]

features_app = typer.Typer(
    name="features",
    help="Feast feature store: apply the repo, materialize, read a cardholder's online features.",
    no_args_is_help=True,
)

StoreOption = Annotated[
    str | None, typer.Option("--store", help="online store profile (default: features.profile)",
                             click_type=click.Choice(["sqlite", "redis"]))
]
RepoOption = Annotated[
    Path | None, typer.Option("--repo", help="working Feast repo folder (default: features.repo_dir)")
]


@features_app.command("apply")
def apply(
    ctx: typer.Context,
    data: Annotated[
        Path | None, typer.Option("--data", help="dataset folder with bank_<k>/transactions.parquet (writes offline)")
    ] = None,
    store_name: StoreOption = None,
    repo: RepoOption = None,
    materialize: Annotated[bool, typer.Option("--materialize", help="also load the online store")] = False,
) -> None:
    """Write the offline features from --data (optional) and `feast apply` the repo."""
    from fedfraud.feature_store.feast_store import apply_repo, materialize_repo, open_store
    from fedfraud.feature_store.offline import write_offline
    from fedfraud.feature_store.store_config import resolve_profile

    cfg = config_of(ctx, needs_secret=True)
    profile = store_name or cfg.features.profile
    resolve_profile(profile)
    store = open_store(cfg.features, repo, profile)
    repo_dir = Path(store.repo_path)
    if data is not None:
        report = write_offline(
            existing_dir(data, "data directory"),
            repo_dir,
            cfg.encoder,
            cfg.privacy,
            cfg.egograph,
            cfg.features.location_cell_deg,
        )
        typer.echo(
            f"offline: banks={len(report.banks)} rows={report.rows} cardholders={report.cardholders} "
            f"merchants={report.merchants} -> {repo_dir / 'data'}"
        )
    names = apply_repo(store)
    typer.echo(f"applied {len(names)} objects to project {store.project} ({profile}) in {repo_dir}")
    if materialize:
        materialize_repo(store)
        typer.echo("materialized")
        if data is not None:
            from fedfraud.serving.warm import warm_fraud_state

            n = warm_fraud_state(update_section(cfg, "features", repo_dir=str(repo_dir)), data)
            typer.echo(f"fraud-feature state of bank {cfg.serving.bank_id}: {n} cardholders warmed")


@features_app.command("materialize")
def materialize(ctx: typer.Context, store_name: StoreOption = None, repo: RepoOption = None) -> None:
    """Load the latest offline row of every cardholder and merchant into the online store."""
    from fedfraud.feature_store.feast_store import materialize_repo, open_store

    cfg = config_of(ctx, needs_secret=True)
    store = open_store(cfg.features, repo, store_name)
    materialize_repo(store)
    typer.echo(f"materialized project {store.project} ({store.config.online_store.type})")


@features_app.command("get")
def get(
    ctx: typer.Context,
    cardholder_id: Annotated[str, typer.Argument(help="raw cardholder id (card number); pseudonymised here")],
    bank: Annotated[int, typer.Option("--bank", min=0, help="bank whose secret pseudonymises the id")] = 0,
    store_name: StoreOption = None,
    repo: RepoOption = None,
) -> None:
    """Print a cardholder's online features (state summary, activity, embedding heads)."""
    from fedfraud.feature_store.online import OnlineStateClient
    from fedfraud.feature_store.privacy import bank_secret, pseudonymize

    cfg = config_of(ctx, needs_secret=True)
    client = OnlineStateClient.open(cfg.features, cfg.egograph, repo, store_name)
    pseudonym = pseudonymize([cardholder_id], bank_secret(cfg.privacy, bank))[0]
    state = client.read_states([pseudonym])[0]
    typer.echo(f"cardholder: {pseudonym} (bank {bank}){'' if state.found else '  [not in the store: empty state]'}")
    if state.rebuilt:
        typer.echo("ego_state: CORRUPT in the store; rebuilt empty")
    typer.echo(f"ego_state: {state.ego!r} version={state.version} bytes={len(state.ego.to_bytes())}")
    for name, value in state.activity.to_features().items():
        typer.echo(f"  {name}: {value}")
    if state.epsilon is not None:
        typer.echo(f"  epsilon: {state.epsilon:.4f}")
    for name, vec in (("time_embedding", state.time_embedding), ("q_t", state.q_t)):
        if vec is not None and len(vec):
            head = ", ".join(f"{x:+.3f}" for x in vec[:4])
            typer.echo(f"  {name}: [{head}, ...] (dim {len(vec)})")


@features_app.command("merchant-risk")
def merchant_risk(
    ctx: typer.Context,
    data: Annotated[Path, typer.Option("--data", help="dataset folder with bank_<k>/transactions.parquet")],
    day: Annotated[
        str | None, typer.Option("--day", help="UTC release day, e.g. 2022-06-30 (default: the data's last day)")
    ] = None,
    top: Annotated[int, typer.Option("--top", min=0, help="flagged merchants to print")] = 10,
    store_name: StoreOption = None,
    repo: RepoOption = None,
) -> None:
    """Make the day's private merchant-risk release and write every bank's `merchant_risk` rows (the daily job)."""
    import pandas as pd

    from fedfraud.core.errors import UserError
    from fedfraud.feature_store.online import OnlineStateClient
    from fedfraud.training.merchant_risk.publish import publish_release

    cfg = config_of(ctx, needs_secret=True)
    if day is not None:
        try:
            pd.Timestamp(day)
        except ValueError:
            raise UserError(f"--day {day!r}: expected a date, e.g. 2022-06-30") from None
    client = OnlineStateClient.open(cfg.features, cfg.egograph, repo, store_name)
    try:
        done = publish_release(cfg, existing_dir(data, "data directory"), client, day, top=top)
    except ValueError as err:
        raise UserError(str(err)) from None
    card = done.card
    typer.echo(f"merchant_risk release {done.date}: rows per bank {done.rows}; per cardholder "
               f"(ε, δ) = ({card['epsilon_per_release']}, {card['delta']}) per release, "
               f"ε = {card['epsilon_period']} over {card['period_days']} daily releases")
    if top and not done.flagged.empty:
        typer.echo(done.flagged.head(top).to_string(index=False))


def register(app: typer.Typer) -> None:
    """Attach the ``features`` group to the root CLI."""
    app.add_typer(features_app, name="features")
