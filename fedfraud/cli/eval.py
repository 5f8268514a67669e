"""``fedfraud eval``: evaluations that need labels. ``eval stacking`` is the thesis Table 4.2 study.

``eval stacking`` trains the fraud model locally (each bank alone), federated
(histogram-based XGBoost federation) and centralized, plus federated with a
stacked score (the cross-fitted anomaly score and two controls), and prints
PR-AUC / recall at 1 % FPR / F1 with 95 % cardholder-bootstrap intervals,
pooled and per bank, as a markdown block for ``docs/benchmarks.md``.

``eval backtest`` replays time with labels coming back late and a daily
federated merchant-risk release (issue 35; :mod:`fedfraud.training.merchant_risk`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import click
import typer

from fedfraud.cli.common import config_of
from fedfraud.config import FedfraudConfig, update_section

__all__ = ["eval_app", "register"]

eval_app = typer.Typer(name="eval", help="Evaluations on labelled data (print markdown for docs/benchmarks.md).",
                       no_args_is_help=True)

DataOption = Annotated[Path, typer.Option("--data", help="dataset directory (bank_<k>/...) or a Sparkov/TabFormer CSV")]
FormatOption = Annotated[str | None, typer.Option("--format", help="CSV format (default: ingest.format)",
                                                  click_type=click.Choice(["auto", "sparkov", "tabformer"]))]
BanksOption = Annotated[int | None, typer.Option("--banks", min=2, help="banks to split a CSV into")]
RegistryOption = Annotated[Path, typer.Option("--registry", help="model registry holding the anomaly model")]
AnomalyVersionOption = Annotated[str, typer.Option("--anomaly-version", help="anomaly model version (or latest)")]
BankSharesOption = Annotated[
    str | None, typer.Option("--bank-shares", help="CSV only: cardholder share per bank, e.g. 0.3,0.25,0.2,0.2,0.05")
]
SkewOption = Annotated[
    bool, typer.Option("--skew", help=("labelled study: banks by home region (partition region) with fraud rates "
                                       "log-spaced from 0.2 % to 5 % (ingest.skew); not with --bank-shares"))
]
PartitionOption = Annotated[
    str | None, typer.Option("--partition", help="CSV only: hash (IID) or region (by home state); default "
                             "ingest.partition, region with --skew", click_type=click.Choice(["hash", "region"]))
]
RepsOption = Annotated[int | None, typer.Option("--reps", min=50, help="bootstrap replicates (cardholders)")]
EngineOption = Annotated[
    str, typer.Option("--engine", help="loopback (the Flower apps in this process) or simulation (Ray)",
                      click_type=click.Choice(["loopback", "simulation"]))
]


def skew_values(skew: bool, shares: tuple[float, ...] | None, partition: str | None = None) -> dict[str, object]:
    """The ``ingest`` values of ``--skew`` / ``--partition``: with ``--skew``, fraud rates 0.2 %..5 % and the region
    partition unless ``--partition`` says otherwise; a one-line error with ``--bank-shares``.
    """
    if not skew:
        return {} if partition is None else {"partition": partition}
    from fedfraud.core.errors import UserError
    from fedfraud.training.data.skew import DEFAULT_SKEW

    if shares is not None:
        raise UserError("--skew and --bank-shares cannot be combined: skewed banks differ by partition and fraud "
                        "rate, not by size")
    return {"partition": partition or "region", "skew": DEFAULT_SKEW}


def study_config(ctx: typer.Context, fmt: str | None, banks: int | None, bank_shares: str | None,
                 skew: bool = False, partition: str | None = None) -> FedfraudConfig:
    """The config of a study on labelled data: ``--format``, ``--banks`` (one bank per ``--bank-shares`` entry when
    not given), ``--bank-shares`` and ``--skew``/``--partition`` into the ``ingest`` section; needs the bank secret.
    """
    from fedfraud.cli.common import parse_shares

    shares = parse_shares(bank_shares)
    if shares is not None and banks is None:
        banks = len(shares)
    return update_section(config_of(ctx, needs_secret=True), "ingest", format=fmt, banks=banks, bank_shares=shares,
                          **skew_values(skew, shares, partition))


@eval_app.command("stacking")
def stacking(
    ctx: typer.Context,
    data: DataOption,
    fmt: FormatOption = None,
    banks: BanksOption = None,
    bank_shares: BankSharesOption = None,
    skew: SkewOption = False,
    partition: PartitionOption = None,
    registry: RegistryOption = Path("artifacts"),
    anomaly_version: AnomalyVersionOption = "latest",
    anomaly_score: Annotated[
        str, typer.Option("--anomaly-score", help="crossfit (out-of-fold AS), registry (published model) or none")
    ] = "crossfit",
    controls: Annotated[bool, typer.Option("--controls/--no-controls", help="positive and permuted controls")] = True,
    with_bagging: Annotated[bool, typer.Option("--with-bagging", help="also Flower FedXgbBagging")] = False,
    seeds: Annotated[int | None, typer.Option("--seeds", min=1, help="model seeds (default fraud.eval_seeds)")] = None,
    reps: Annotated[int | None, typer.Option("--reps", min=50, help="bootstrap replicates (cardholders)")] = None,
    rounds: Annotated[int | None, typer.Option("--rounds", min=1, help="FedXgbBagging rounds (--with-bagging)")] = None,
    num_cpus: Annotated[int, typer.Option("--num-cpus", min=1, max=2, help="Ray CPUs for the simulation")] = 2,
    out: Annotated[Path | None, typer.Option("--out", help="also write the markdown block here")] = None,
) -> None:
    """Local / FL / Central, stacked scores and controls, with 95 % cardholder-bootstrap intervals."""
    from fedfraud.cli.bench import emit
    from fedfraud.training.fraud.pipeline import stacking_study

    cfg = study_config(ctx, fmt, banks, bank_shares, skew, partition)
    if rounds is not None:
        cfg = update_section(cfg, "fraud", federated_rounds=rounds)
    report = stacking_study(cfg, data, registry, anomaly_version, anomaly_source=anomaly_score, controls=controls,
                            with_bagging=with_bagging, seeds=seeds, reps=reps, num_cpus=num_cpus)
    emit(report.to_markdown(), out)


def _days(text: str | None, flag: str) -> tuple[int, ...] | None:
    """``"10,21"`` → ``(10, 21)``; a one-line error for anything else."""
    from fedfraud.core.errors import UserError

    if text is None:
        return None
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise UserError(f"{flag} {text!r}: expected whole days separated by commas, e.g. 10,21") from None


@eval_app.command("backtest")
def backtest(
    ctx: typer.Context,
    csv: Annotated[Path, typer.Option("--csv", help="labelled Sparkov/Kaggle or TabFormer CSV (.csv or .csv.gz)")],
    train_until: Annotated[str, typer.Option("--train-until", help="UTC date: train before it, replay from it")],
    labels_delay_days: Annotated[
        int, typer.Option("--labels-delay-days", min=0, help="a transaction's label comes back D days after it")
    ],
    out: Annotated[Path, typer.Option("--out", help="folder for scores.csv, report.md, merchant_releases.csv")],
    fmt: FormatOption = None,
    banks: BanksOption = None,
    skew: SkewOption = False,
    partition: PartitionOption = None,
    scenarios: Annotated[
        Path | None, typer.Option("--scenarios", help="CSV mapping trans_num to a fraud scenario: figures per scenario")
    ] = None,
    until: Annotated[
        str | None, typer.Option("--until", help="UTC date: stop the replay before it (a validation period)")
    ] = None,
    window_days: Annotated[
        str | None, typer.Option("--window-days", help="the bank's own statistics' windows in days, e.g. 10,21")
    ] = None,
    cpp_days: Annotated[
        int | None, typer.Option("--cpp-days", min=1, help="common-point-of-purchase horizon N")
    ] = None,
    max_merchants: Annotated[
        int | None, typer.Option("--max-merchants", min=1, help="k: merchants one cardholder adds to per window")
    ] = None,
    per_merchant_cap: Annotated[
        int | None, typer.Option("--per-merchant-cap", min=1, help="most one cardholder adds to one merchant's count")
    ] = None,
    released_stats: Annotated[
        str | None, typer.Option("--released-stats", help="statistics the release carries, e.g. frauds,sole_frauds")
    ] = None,
    release_window_days: Annotated[
        str | None, typer.Option("--release-window-days", help="the release's windows in days, e.g. 21")
    ] = None,
    release_max_merchants: Annotated[
        int | None, typer.Option("--release-max-merchants", min=1, help="k_f: release buckets per cardholder")
    ] = None,
    release_average: Annotated[
        int | None, typer.Option("--release-average", min=1, help="fed features average the last N releases")
    ] = None,
    trainer: Annotated[
        str, typer.Option("--fl-trainer", help="hist (histogram federation) or central (pooled stand-in, faster)")
    ] = "hist",
    reps: Annotated[int | None, typer.Option("--reps", min=50, help="bootstrap replicates (cardholders)")] = None,
    epsilon: Annotated[
        list[float] | None,
        typer.Option("--epsilon", help=(
            "repeatable: one more fl+merchant-fed row with every daily release private at this ε per cardholder "
            "per release (δ of the merchant-noise config); the clear row is ε = ∞")),
    ] = None,
    noise_seed: Annotated[
        int, typer.Option("--noise-seed", min=0, help="seed of the private releases' noise (reproducible rows)")
    ] = 0,
) -> None:
    """Replay time with labels D days late and a daily federated merchant-risk release; scores and intervals."""
    from contextlib import ExitStack

    import pandas as pd

    from fedfraud.bench.detection import load_scenarios
    from fedfraud.cli.common import readable_file
    from fedfraud.core.errors import UserError
    from fedfraud.training.merchant_risk.backtest import PrivateRelease, backtest_frames, load_bank_frames

    if trainer not in ("hist", "central"):
        raise UserError(f"--fl-trainer {trainer!r}: choose hist or central")
    try:
        start, stop = pd.Timestamp(train_until), None if until is None else pd.Timestamp(until)
    except ValueError:
        raise UserError(f"--train-until {train_until!r} / --until {until!r}: expected dates, e.g. 2022-11-01") from None
    if stop is not None and stop <= start:
        raise UserError(f"--until {until} must be after --train-until {train_until}")
    readable_file(csv)
    mapping = load_scenarios(readable_file(scenarios)) if scenarios is not None else None
    cfg = update_section(config_of(ctx, needs_secret=True), "ingest", format=fmt, banks=banks,
                         **skew_values(skew, None, partition))
    cfg = update_section(
        cfg, "merchant_risk", label_delay_days=labels_delay_days, cpp_days=cpp_days, max_merchants=max_merchants,
        per_merchant_cap=per_merchant_cap, release_max_merchants=release_max_merchants,
        release_average=release_average, window_days=_days(window_days, "--window-days"),
        release_window_days=_days(release_window_days, "--release-window-days"),
        released_stats=None if released_stats is None else tuple(s.strip() for s in released_stats.split(",")))
    risk = cfg.merchant_risk
    with ExitStack() as stack:
        skew_info: dict[str, object] = {}
        frames = load_bank_frames(csv, cfg.ingest, stack, skew_info)
        if len(frames) < 2:
            raise UserError(f"{csv} split into {len(frames)} bank; the federated variants need at least 2 (--banks)")
        try:
            private = tuple(PrivateRelease.calibrated(e, risk, len(frames), cfg.merchant_noise, seed=noise_seed)
                            for e in dict.fromkeys(epsilon or ()))
        except ValueError as err:
            raise UserError(f"--epsilon: {err}") from None
        try:
            report = backtest_frames(frames, train_until, cfg.fraud, cfg.encoder, cfg.privacy, risk, until=until,
                                     scenarios=mapping, trainer="hist" if trainer == "hist" else "central", reps=reps,
                                     private=private)
        except ValueError as err:
            raise UserError(str(err)) from None
    report.info["data"] = str(csv)
    report.info.update(skew_info)
    out.mkdir(parents=True, exist_ok=True)
    report.scores.to_csv(out / "scores.csv", index=False)
    report.releases.to_csv(out / "merchant_releases.csv", index=False)
    markdown = report.to_markdown()
    (out / "report.md").write_text(markdown, encoding="utf-8")
    typer.echo(markdown)
    typer.echo(f"wrote {out / 'scores.csv'}, {out / 'report.md'}, {out / 'merchant_releases.csv'}", err=True)


def register(app: typer.Typer) -> None:
    """Attach the ``eval`` group to the root CLI."""
    app.add_typer(eval_app, name="eval")
