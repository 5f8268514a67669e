"""``fedfraud models list | promote | rollback``: the registry's versions, aliases and audit log.

``champion`` decides in serving and batch scoring; ``challenger`` is the
candidate a retrain registers. Every alias change is appended to the kind's
``audit.jsonl`` with who made it, why and on what evidence; serving swaps a
promotion or a rollback in between micro-batches.
"""

from __future__ import annotations

import getpass
import json
from typing import TYPE_CHECKING, Annotated

import typer

from fedfraud.cli.common import config_of
from fedfraud.core.errors import UserError

if TYPE_CHECKING:
    from fedfraud.training.registry import ModelVersion

__all__ = ["register"]

KINDS = ("anomaly", "fraud", "tokenizer", "hin2vec")

models_app = typer.Typer(name="models", help="Registry versions and the champion/challenger aliases.",
                         no_args_is_help=True)

KindArg = Annotated[str, typer.Argument(help="model kind: anomaly, fraud, tokenizer or hin2vec")]
ReasonOption = Annotated[str, typer.Option("--reason", help="why (kept in the audit log)")]
RegistryOption = Annotated[
    str | None, typer.Option("--registry", help="registry folder (default: serving.registry_root)")
]
#: The figures `models list` shows per kind, in order, when a card has them (a card's other keys stay in --json).
HEADLINE: tuple[str, ...] = ("test_pr_auc", "test_recall_at_fpr", "test_f1", "fraud_roc_auc_mean",
                             "fraud_pr_auc_mean", "val_loss_mean", "rounds", "psi_doc", "vocab_size")


@models_app.callback()
def _models(
    ctx: typer.Context,
    registry: RegistryOption = None,
) -> None:
    ctx.meta["registry"] = registry


def _registry(ctx: typer.Context, registry: str | None = None):  # noqa: ANN202 - ModelRegistry, imported lazily
    """The subcommand's ``--registry``, else the group's (``fedfraud models --registry DIR list``), else the
    config's ``serving.registry_root``.
    """
    from fedfraud.training.registry import ModelRegistry

    return ModelRegistry(registry or ctx.meta.get("registry") or config_of(ctx).serving.registry_root)


def _kind(kind: str) -> str:
    if kind not in KINDS:
        raise UserError(f"unknown model kind {kind!r}; choose from {', '.join(KINDS)}")
    return kind


def _actor() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):
        return "cli"


@models_app.command("list")
def list_models(
    ctx: typer.Context,
    kind: Annotated[str | None, typer.Argument(help="one kind (default: all)")] = None,
    audit: Annotated[bool, typer.Option("--audit", help="also print the alias audit log")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="every version as one JSON document (all metrics)")] = False,
    registry: RegistryOption = None,
) -> None:
    """Versions with their aliases, creation time and headline metrics."""
    reg = _registry(ctx, registry)
    documents: dict[str, list[dict[str, object]]] = {}
    for k in [_kind(kind)] if kind else list(KINDS):
        versions = reg.versions(k)
        if not versions:
            continue
        aliases = reg.aliases(k)
        by_version: dict[int, list[str]] = {}
        for name, number in aliases.items():
            by_version.setdefault(number, []).append(name)
        if "champion" not in aliases:
            by_version.setdefault(versions[-1].version, []).append("champion (newest; none promoted)")
        documents[k] = [{"version": v.version, "created_at": v.created_at, "aliases": by_version.get(v.version, []),
                         "metrics": v.metrics} for v in versions]
        if as_json:
            continue
        _print_table(k, versions, by_version)
        if audit:
            for entry in reg.audit(k):
                typer.echo(f"    {entry['at']} {entry['alias']}: {entry['from']} -> {entry['to']} by {entry['actor']}"
                           f" ({entry['reason']}) {json.dumps(entry['evidence'], sort_keys=True)}")
    if not documents and not as_json:
        typer.echo(f"no models in {reg.root}" + (f" of kind {kind}" if kind else ""), err=True)
    if as_json:
        typer.echo(json.dumps(documents, indent=2, sort_keys=True, default=str))


def _print_table(kind: str, versions: list[ModelVersion], by_version: dict[int, list[str]]) -> None:
    """One table per kind: a row per version, the :data:`HEADLINE` metrics any of its versions has as columns."""
    from rich.console import Console
    from rich.table import Table

    columns = [m for m in HEADLINE if any(isinstance(v.metrics.get(m), (int, float)) for v in versions)]
    table = Table(title=kind, title_justify="left")
    for name in ("version", "created", *columns, "aliases"):
        table.add_column(name, justify="right" if name in columns else "left")
    for v in versions:
        cells = [f"{v.metrics[m]:.4g}" if isinstance(v.metrics.get(m), (int, float)) else "" for m in columns]
        table.add_row(f"v{v.version}", str(v.created_at), *cells, ", ".join(by_version.get(v.version, [])))
    Console(width=max(120, len(columns) * 14 + 60)).print(table)


@models_app.command("promote")
def promote(
    ctx: typer.Context,
    kind: KindArg,
    version: Annotated[str, typer.Argument(help="version to make champion: 3, v3 or challenger")],
    reason: ReasonOption,
    registry: RegistryOption = None,
) -> None:
    """Make a version the champion (serving swaps it in without losing a transaction)."""
    entry = _registry(ctx, registry).promote(_kind(kind), version, actor=_actor(), reason=reason)
    typer.echo(f"{kind} champion: v{entry['from']} -> v{entry['to']}" if entry["from"] else
               f"{kind} champion: v{entry['to']}")


@models_app.command("rollback")
def rollback(ctx: typer.Context, kind: KindArg, reason: ReasonOption, registry: RegistryOption = None) -> None:
    """Make the previous champion champion again."""
    entry = _registry(ctx, registry).rollback(_kind(kind), actor=_actor(), reason=reason)
    typer.echo(f"{kind} champion: v{entry['from']} -> v{entry['to']} (rolled back)")


def register(app: typer.Typer) -> None:
    """Attach ``models`` to the root CLI."""
    app.add_typer(models_app)
