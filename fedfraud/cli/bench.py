"""``fedfraud bench``: benchmarks that print a markdown block; ``bench --record NAME`` also writes the run's record
(``docs/results/NAME/``), from which ``docs/benchmarks.md`` is rendered (``fedfraud.bench.records``).

One function per subcommand on :data:`bench_app`; to add one (``anomaly``,
``serving``, ``tokenizer``), write ``@bench_app.command("name")`` below, import
the benchmark inside the function and finish with :func:`emit`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import click
import typer

from fedfraud.cli.common import config_of, readable_file
from fedfraud.core.errors import UserError

__all__ = ["bench_app", "emit", "register"]

bench_app = typer.Typer(
    name="bench",
    help="Benchmarks; each prints a markdown block (--out: to a file too; bench --record NAME: a record in "
    "docs/results/NAME/, which docs/benchmarks.md is rendered from).",
    no_args_is_help=True,
)



@bench_app.callback()
def _bench(
    ctx: typer.Context,
    record: RecordOption = None,
    json_file: Annotated[Path | None, typer.Option("--json", help="also write the run's record to this file")] = None,
) -> None:
    """Benchmarks are self-contained runs: with no bank secret set, each draws a random one (announced)."""
    from fedfraud.feature_store.privacy import per_run_secret

    start_record(ctx, record, ctx.invoked_subcommand or "", json_file)
    per_run_secret(config_of(ctx).privacy)


#: ``--record NAME`` of the commands that write a benchmark record (the bench group, the long ``eval`` studies).
RecordOption = Annotated[
    str | None, typer.Option("--record", metavar="NAME", help="also write the run's record to "
                             "docs/results/NAME/<date>-<commit>.json (docs/benchmarks.md is rendered from them)")
]


def start_record(ctx: typer.Context, record: str | None, default: str, json_file: Path | None = None) -> None:
    """Note the load average now, and where :func:`emit` writes the run's record (``record``: a results folder;
    ``json_file``: a file); a bad name is a one-line error.
    """
    import re

    from fedfraud.bench.harness import load_average

    if record is not None and not re.fullmatch(r"[a-z0-9][a-z0-9-]*", record):
        raise UserError(f"--record {record!r}: a name of lowercase letters, digits and dashes, e.g. serving-peers")
    ctx.meta["bench_record"] = (record or default, record is not None, json_file, load_average())


#: The third-party file a detection bench reads, or an ingested/generated dataset instead (`_one_source`).
CsvOption = Annotated[
    Path | None, typer.Option("--csv", help="labelled Sparkov/Kaggle or TabFormer CSV (.csv or .csv.gz)")
]
DataOption = Annotated[Path | None, typer.Option("--data", help="or: an ingested/generated dataset dir")]
OutOption = Annotated[Path | None, typer.Option("--out", help="write the markdown block to this file as well")]


def emit(markdown: str, out: Path | None, figures: object = None) -> None:
    """Print a benchmark's markdown block and, with ``--out``, write it to a file; with ``bench --record`` /
    ``--json``, write the run's record too (``figures``: the result object, kept as data when it is a dataclass).
    """
    typer.echo(markdown)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(markdown, encoding="utf-8")
        typer.echo(f"wrote {out}", err=True)
    ctx = click.get_current_context(silent=True)
    name, to_results, json_file, load_before = (ctx.meta.get("bench_record") if ctx else None) or ("", False, None, "")
    if to_results or json_file is not None:
        from fedfraud.bench.records import build_record, latest_records, write_record

        record = build_record(name, markdown, load_before, figures, latest_records().get(name))
        for path in ([json_file] if json_file is not None else []) + ([None] if to_results else []):
            typer.echo(f"wrote record {write_record(record, path)}", err=True)


@bench_app.command("features")
def features(
    ctx: typer.Context,
    pairs: Annotated[int, typer.Option("--pairs", min=100, help="pairs per fidelity correlation")] = 100_000,
    quick: Annotated[bool, typer.Option("--quick", help="small sizes for a smoke run (~20 s)")] = False,
    out: OutOption = None,
    store: Annotated[
        str | None, typer.Option("--store", help="instead: online feature-store latency",
                                 click_type=click.Choice(["sqlite", "redis"]))
    ] = None,
) -> None:
    """Encoder fidelity under LDP noise, featurizer / ego-graph throughput, state size, CSV ingest rate."""
    from fedfraud.bench.features import run_features_bench

    cfg = config_of(ctx)
    if store is not None:
        from fedfraud.bench.store import run_store_bench

        emit(run_store_bench(store, cfg.features, cfg.encoder, cfg.privacy, cfg.egograph, quick=quick), out)
        return
    result = run_features_bench(pairs, quick, cfg.encoder, cfg.privacy, cfg.egograph)
    emit(result.to_markdown(), out, result)


@bench_app.command("tokenizer")
def tokenizer(
    ctx: typer.Context,
    quick: Annotated[bool, typer.Option("--quick", help="small sizes for a smoke run")] = False,
    out: OutOption = None,
    no_privacy: Annotated[
        bool, typer.Option("--no-privacy", help="federated run with exact counts (as `tokenizer train --no-privacy`)")
    ] = False,
) -> None:
    """FedByteBPE: federated vs centralized training time as ratios (with load average and commit), psi/Pi table,
    service throughput. Corpus size: --set tokenizer.bench_docs_per_client=N.
    """
    from fedfraud.bench.tokenizer import run_tokenizer_bench

    result = run_tokenizer_bench(config_of(ctx).tokenizer, quick=quick, privacy=not no_privacy)
    emit(result.to_markdown(), out, result)


@bench_app.command("encoder")
def encoder(
    ctx: typer.Context,
    csv: CsvOption = None,
    sizes: Annotated[str, typer.Option("--sizes", help="graphs per embed call, comma-separated")] = "1,4,16,128",
    calls: Annotated[int, typer.Option("--calls", min=20, help="timed calls per cell and path")] = 300,
    threads: Annotated[str, typer.Option("--threads", help="torch thread counts, comma-separated (serving: 1)")] = "1",
    out: OutOption = None,
) -> None:
    """Anomaly encoder: ms per embed call (p50/p99) and torch ops, sparse PyG path vs dense inference path."""
    from fedfraud.bench.encoder import run_encoder_bench

    try:
        size_list = tuple(int(v) for v in sizes.split(","))
        thread_list = tuple(int(v) for v in threads.split(","))
    except ValueError as exc:
        raise UserError(f"--sizes / --threads take comma-separated integers ({exc})") from exc
    emit(run_encoder_bench(config_of(ctx), size_list, calls, thread_list, csv).to_markdown(), out)


@bench_app.command("serving")
def serving(
    ctx: typer.Context,
    registry: Annotated[
        Path | None, typer.Option("--registry", help="registry with trained models (default: fresh)")
    ] = None,
    backlog: Annotated[
        int, typer.Option("--backlog", min=100, help="transactions replayed at once for throughput")
    ] = 3000,
    seconds: Annotated[float, typer.Option("--seconds", min=1, help="duration of each offered load")] = 8.0,
    merchant_risk_ab: Annotated[
        bool, typer.Option("--merchant-risk-ab", help="instead: p50/p99 at 250 and 1,000 tx/s without and with the "
                           "merchant-risk read, alternated in one run")
    ] = False,
    rounds: Annotated[
        int, typer.Option("--rounds", min=1, help="A/B (or A/B/C/D) rounds (with --merchant-risk-ab, --peers or "
                          "--http-only)")
    ] = 2,
    peers: Annotated[
        bool, typer.Option("--peers", help="instead: the plain consumer → XGBoost → producer peer, the hot path with "
                           "its GNN stage off, the full hot path and the full hot path deciding with the GNN fraud "
                           "model (fedrpda), alternated in one run; throughput, p50/p99 at "
                           "250 and 1,000 tx/s and CPU per transaction, each as a ratio to the peer")
    ] = False,
    http_only: Annotated[
        bool, typer.Option("--http-only", help="instead: only POST /score p50/p99 on the documented port (the "
                           "direct-ingress front), straight to the replica's port and through Serve's proxy, "
                           "alternated --rounds times on a deployment that reads no Kafka (about a minute)")
    ] = False,
    requests: Annotated[
        int, typer.Option("--requests", min=50, help="with --http-only: measured requests per door and round")
    ] = 300,
    out: OutOption = None,
) -> None:
    """End-to-end streaming: ceiling, max sustained tx/s, p50/p99/p99.9 at 250/500/1,000/2,000 tx/s offered, and
    POST /score through each door (documented port, the replica's own port, Serve's proxy).
    """
    if http_only:
        from fedfraud.bench.serving import run_http_bench

        result = run_http_bench(config_of(ctx), requests=requests, rounds=rounds)
        emit(result.to_markdown(), out, result)
        return
    if peers:
        from fedfraud.bench.serving import run_peer_bench

        result = run_peer_bench(config_of(ctx), rounds=rounds, backlog=backlog, seconds=seconds)
        emit(result.to_markdown(), out, result)
        return
    if merchant_risk_ab:
        from fedfraud.bench.merchant_ab import run_merchant_risk_ab

        emit(run_merchant_risk_ab(config_of(ctx), rounds=rounds, seconds=seconds).to_markdown(), out)
        return
    from fedfraud.bench.serving import run_serving_bench

    result = run_serving_bench(registry, backlog, seconds=seconds, config=config_of(ctx))
    emit(result.to_markdown(), out)


@bench_app.command("chaos")
def chaos(
    ctx: typer.Context,
    transactions: Annotated[int, typer.Option("--transactions", min=50, help="streamed per fault")] = 600,
    rate: Annotated[float, typer.Option("--rate", min=10, help="offered tx/s during each fault")] = 150.0,
    outage_s: Annotated[float, typer.Option("--outage-s", min=1, help="how long each outage lasts")] = 5.0,
    fault: Annotated[
        list[str] | None,
        typer.Option("--fault", help="run only these (repeatable): malformed records | broker outage | "
                     "Redis outage | replica kill"),
    ] = None,
    out: OutOption = None,
) -> None:
    """One fault at a time on the live stream (Redis profile); in/decided/DLQ/duplicates/lost from the topics."""
    from fedfraud.bench.chaos import run_chaos_bench

    try:
        result = run_chaos_bench(transactions, rate, outage_s, config_of(ctx), tuple(fault) if fault else None)
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    emit(result.to_markdown(), out)


@bench_app.command("retrain")
def retrain(
    ctx: typer.Context,
    cardholders: Annotated[int, typer.Option("--cardholders", min=50, help="generated cardholders")] = 800,
    rounds: Annotated[int, typer.Option("--rounds", min=1, help="federated rounds of each cycle")] = 8,
    rate: Annotated[float, typer.Option("--rate", min=10, help="offered tx/s of the shadow A/B")] = 250.0,
    block_s: Annotated[float, typer.Option("--block-s", min=1, help="seconds of each A/B block")] = 4.0,
    blocks: Annotated[int, typer.Option("--blocks", min=1, help="A/B pairs (off, on)")] = 2,
    out: OutOption = None,
) -> None:
    """A federated retrain cycle's wall time, serving p99 with and without shadow scoring, labelled frauds the
    policy needed to decide.
    """
    from fedfraud.bench.retrain import run_retrain_bench

    result = run_retrain_bench(config_of(ctx), cardholders=cardholders, rounds=rounds, rate=rate, block_s=block_s,
                               blocks=blocks)
    emit(result.to_markdown(), out)


@bench_app.command("anomaly")
def anomaly(
    ctx: typer.Context,
    csv: Annotated[
        Path | None, typer.Option("--csv", help="labelled Sparkov/Kaggle or TabFormer CSV (.csv or .csv.gz)")
    ] = None,
    data: Annotated[
        Path | None, typer.Option("--data", help="or: a generated/ingested dataset dir (per-scenario table)")
    ] = None,
    work: Annotated[Path, typer.Option("--work", help="data, registries and caches go here")] = Path(
        "out/bench-detection"
    ),
    rounds: Annotated[int | None, typer.Option("--rounds", min=1, help="federated rounds (default 10)")] = None,
    federated_only: Annotated[bool, typer.Option("--federated-only", help="skip the centralized run")] = False,
    resamples: Annotated[int, typer.Option("--resamples", min=50, help="bootstrap resamples")] = 500,
    scenarios: Annotated[
        Path | None,
        typer.Option("--scenarios", help="CSV mapping trans_num to a fraud scenario: one ROC-AUC per scenario"),
    ] = None,
    skip_model: Annotated[
        bool,
        typer.Option("--skip-model", help="train nothing; baselines on validation cardholders only (no test figure)"),
    ] = False,
    out: OutOption = None,
) -> None:
    """Label-free anomaly score vs label-free baselines on third-party data, split by cardholder, with 95% CIs."""
    from fedfraud.bench.detection import run_detection_bench

    _one_source(csv, data)
    if scenarios is not None:
        readable_file(scenarios)
    config_of(ctx)
    overrides = {"rounds": rounds} if rounds else {}
    modes = ("federated",) if federated_only else ("federated", "centralized")
    result = run_detection_bench(
        csv, work, overrides=overrides, modes=() if skip_model else modes, resamples=resamples, data=data,
        splits=("val",) if skip_model else ("val", "test"), scenarios=scenarios,
    )
    emit(result.to_markdown(), out)


def _valid_attack(mode: str) -> bool:
    """Whether ``mode`` is an attack the simulated malicious bank knows."""
    from fedfraud.training.federated.config import AttackConfig

    try:
        AttackConfig(mode=mode)
    except ValueError:
        return False
    return True


def _one_source(csv: Path | None, data: Path | None) -> None:
    """Exactly one of ``--csv`` (a readable file) or ``--data`` (a dataset dir), or a one-line error."""
    if (csv is None) == (data is None):
        raise UserError("give exactly one of --csv FILE or --data DIR")
    if csv is not None:
        readable_file(csv)


def _positive_epsilons(epsilons: tuple[float, ...]) -> None:
    """Every ``--epsilon`` is > 0 (``inf`` = DP off), or a one-line error."""
    bad = [e for e in epsilons if not e > 0 or e != e]  # e != e: NaN
    if bad:
        raise UserError(f"--epsilon must be > 0 (inf for DP off), got {bad[0]}")


def _anomaly_changes(cfg: object) -> dict[str, object]:
    """The run keys of the ``anomaly`` section (``--set anomaly.cardholder_dp.sampling_rate=0.5``, ``anomaly.lr``)
    that differ from their defaults, so that ``--set`` reaches a bench's runs.
    """
    from fedfraud.training.anomaly.config import AnomalyConfig
    from fedfraud.training.anomaly.federated.task import RunSettings

    flat = RunSettings.from_config(cfg, Path("."), Path(".")).to_flat()  # type: ignore[arg-type]
    defaults = RunSettings.defaults()
    mine = {n.replace("_", "-") for n in AnomalyConfig.model_fields}
    return {
        k: v
        for k, v in flat.items()
        if (k in mine or k.startswith("cardholder-dp-")) and defaults.get(k) != v
    }


@bench_app.command("privacy")
def privacy(
    ctx: typer.Context,
    csv: CsvOption = None,
    data: DataOption = None,
    work: Annotated[Path, typer.Option("--work", help="data, registries and caches go here")] = Path(
        "out/bench-privacy"
    ),
    epsilon: Annotated[
        list[float] | None, typer.Option("--epsilon", help="ε of a row (repeatable; inf = DP off); default 1 3 8 inf")
    ] = None,
    rounds: Annotated[int | None, typer.Option("--rounds", min=1, help="federated rounds (default 10)")] = None,
    local_epochs: Annotated[int | None, typer.Option("--local-epochs", min=1, help="default 10")] = None,
    samples_per_epoch: Annotated[
        int | None, typer.Option("--samples-per-epoch", min=1, help="transitions per local epoch (default 1024)")
    ] = None,
    clipping_norm: Annotated[
        float | None, typer.Option("--clipping-norm", min=1e-9, help="L2 clip of a bank's update")
    ] = None,
    resamples: Annotated[int, typer.Option("--resamples", min=50, help="bootstrap resamples")] = 500,
    label: Annotated[str, typer.Option("--label", help="appended to the heading, e.g. ' (small run)'")] = "",
    ldp: Annotated[
        bool, typer.Option("--ldp/--no-ldp", help="add a DP-off run with the calibrated feature mechanism")
    ] = True,
    unit: Annotated[
        str, typer.Option("--unit", help="unit of privacy: bank (client-level DP on the updates) or cardholder "
                          "(DP-SGD inside each bank; knobs: --set anomaly.cardholder_dp.*)")
    ] = "bank",
    dsfl: Annotated[
        bool, typer.Option("--dsfl/--no-dsfl", help="a DSFL row per ε too (aggregation dsfl, its Laplace noise "
                           "calibrated to the same ε in the same unit)")
    ] = True,
    validation_only: Annotated[
        bool, typer.Option("--validation-only", help="score validation cardholders only (tuning, not a test look)")
    ] = False,
    out: OutOption = None,
) -> None:
    """DP's utility cost: the anomaly model's fraud ROC-AUC / PR-AUC at ε ∈ {1, 3, 8, ∞}, 95% CIs."""
    from fedfraud.bench.privacy import PRIVACY_EPSILONS, run_privacy_bench

    _one_source(csv, data)
    epsilons = tuple(epsilon or PRIVACY_EPSILONS)
    _positive_epsilons(epsilons)
    if unit not in ("bank", "cardholder"):
        raise UserError(f"--unit must be bank or cardholder, got {unit!r}")
    cfg = config_of(ctx)
    dp = cfg.federated.dp
    calibrated = cfg.privacy.model_copy(update={"mechanism": "calibrated"}) if ldp else None
    overrides: dict[str, object] = {"dp-delta": dp.delta, "dp-clipping-norm": clipping_norm or dp.clipping_norm}
    overrides.update(_anomaly_changes(cfg))
    for key, value in (("rounds", rounds), ("local-epochs", local_epochs), ("samples-per-epoch", samples_per_epoch)):
        if value is not None:
            overrides[key] = value
    result = run_privacy_bench(
        csv, work, epsilons, overrides=overrides, resamples=resamples, data=data, label=label, calibrated=calibrated,
        unit=unit, validation_only=validation_only, dsfl=dsfl,
    )
    emit(result.to_markdown(), out)


@bench_app.command("adversary")
def adversary(
    ctx: typer.Context,
    csv: CsvOption = None,
    data: DataOption = None,
    work: Annotated[Path, typer.Option("--work", help="data, registries and caches go here")] = Path(
        "out/bench-adversary"
    ),
    aggregation: Annotated[
        list[str] | None,
        typer.Option("--aggregation", help="rule of a row (repeatable); default all: fedavg fedmedian fedtrimmedavg "
                     "krum multikrum dsfl"),
    ] = None,
    attack: Annotated[
        list[str] | None,
        typer.Option("--attack", help='attack of a column (repeatable: none, scale:F, flip-targets); default none '
                     "scale:-10 flip-targets"),
    ] = None,
    epsilon: Annotated[
        list[float] | None, typer.Option("--epsilon", help="ε of a block (repeatable; inf = DP off); default inf")
    ] = None,
    rounds: Annotated[int | None, typer.Option("--rounds", min=1, help="federated rounds (default 3)")] = None,
    local_epochs: Annotated[int | None, typer.Option("--local-epochs", min=1, help="default 2")] = None,
    resamples: Annotated[int, typer.Option("--resamples", min=50, help="bootstrap resamples")] = 500,
    label: Annotated[str, typer.Option("--label", help="appended to the heading")] = "",
    reuse: Annotated[
        bool, typer.Option("--reuse", help="take models an earlier run published under --work with the same settings")
    ] = False,
    cell: Annotated[
        list[str] | None,
        typer.Option("--cell", help="RULE/ATTACK (repeatable): only these cells instead of the whole product"),
    ] = None,
    out: OutOption = None,
) -> None:
    """One malicious bank: fraud ROC-AUC per aggregation rule, with and without each attack (and DP), 95% CIs."""
    import math

    from fedfraud.bench.adversary import ADVERSARY_ATTACKS, run_adversary_bench
    from fedfraud.training.federated.config import AGGREGATIONS

    _one_source(csv, data)
    rules = tuple(aggregation or AGGREGATIONS)
    unknown = [r for r in rules if r not in AGGREGATIONS]
    if unknown:
        raise UserError(f"--aggregation {unknown[0]!r} is not one of {', '.join(AGGREGATIONS)}")
    attacks = tuple("" if a == "none" else a for a in (attack or ADVERSARY_ATTACKS))
    for a in attacks:
        if not _valid_attack(a):
            raise UserError(f"--attack {a!r}: use none, scale:<factor> or flip-targets")
    epsilons = tuple(epsilon or (math.inf,))
    _positive_epsilons(epsilons)
    cells: list[tuple[str, str]] = []
    for c in cell or []:
        rule, _, att = c.partition("/")
        att = "" if att == "none" else att
        if rule not in AGGREGATIONS or att not in attacks and not _valid_attack(att):
            raise UserError(f"--cell {c!r}: use RULE/ATTACK, e.g. fedmedian/scale:-10")
        cells.append((rule, att))
    dp = config_of(ctx).federated.dp
    overrides: dict[str, object] = {"dp-delta": dp.delta, "dp-clipping-norm": dp.clipping_norm}
    for key, value in (("rounds", rounds), ("local-epochs", local_epochs)):
        if value is not None:
            overrides[key] = value
    result = run_adversary_bench(
        csv, work, rules, attacks, epsilons, overrides=overrides, resamples=resamples, data=data, label=label,
        reuse=reuse, pairs_only=cells,
    )
    emit(result.to_markdown(), out)


@bench_app.command("attacks")
def attacks(
    ctx: typer.Context,
    csv: CsvOption = None,
    data: DataOption = None,
    work: Annotated[Path, typer.Option("--work", help="data, registries and caches go here")] = Path(
        "out/bench-attacks"
    ),
    epsilon: Annotated[
        list[float] | None,
        typer.Option("--epsilon", help="ε of a membership row (repeatable; inf = DP off); default inf 1 8"),
    ] = None,
    rounds: Annotated[int | None, typer.Option("--rounds", min=1, help="federated rounds (default 1)")] = None,
    local_epochs: Annotated[int | None, typer.Option("--local-epochs", min=1, help="default 2")] = None,
    per_cardholder: Annotated[
        int, typer.Option("--per-cardholder", min=2, help="transactions of each cardholder the attacker scores")
    ] = 100,
    histograms: Annotated[
        bool, typer.Option("--histograms/--no-histograms", help="run the fraud model's histogram attack")
    ] = True,
    inversion: Annotated[
        bool, typer.Option("--inversion/--no-inversion", help="run the inversion bound (what L', T' give away)")
    ] = True,
    inversion_only: Annotated[
        bool, typer.Option("--inversion-only", help="run only the inversion bound: no model is trained")
    ] = False,
    inversion_rows: Annotated[
        int, typer.Option("--inversion-rows", min=100, help="train-split transactions the inversion bound decodes")
    ] = 20_000,
    gradient_inversion: Annotated[
        bool, typer.Option("--gradient-inversion/--no-gradient-inversion",
                           help="run the iterative gradient-inversion attack on the anomaly model (tens of minutes)")
    ] = False,
    gradient_inversion_only: Annotated[
        bool, typer.Option("--gradient-inversion-only", help="run only the gradient-inversion attack")
    ] = False,
    gradient_graphs: Annotated[
        int, typer.Option("--gradient-graphs", min=4, help="ego graphs the gradient-inversion attack attacks")
    ] = 8,
    gradient_steps: Annotated[int, typer.Option("--gradient-steps", min=10, help="Adam steps per restart")] = 200,
    gradient_restarts: Annotated[int, typer.Option("--gradient-restarts", min=1, help="restarts per batch")] = 1,
    hin2vec_only: Annotated[
        bool, typer.Option("--hin2vec-only", help="run only the linkage and membership attacks on G-HIN2Vec "
                           "embeddings (reuses --work's hin2vec model, e.g. that of `bench hin2vec`)")
    ] = False,
    resamples: Annotated[int, typer.Option("--resamples", min=50, help="bootstrap resamples")] = 500,
    label: Annotated[str, typer.Option("--label", help="appended to the heading")] = "",
    out: OutOption = None,
) -> None:
    """Attacks on what leaves a bank: cardholder membership inference (with and without DP), what the server
    reconstructs from the fraud model's histograms, merchant membership, and what a perfect inversion of an update
    recovers (the LDP bound), with 95% CIs and no-information baselines; optionally an iterative gradient-inversion
    attack on the anomaly model's gradient.
    """
    from fedfraud.bench.attacks import ATTACK_EPSILONS, run_attacks_bench

    _one_source(csv, data)
    if hin2vec_only:
        from fedfraud.bench.hin2vec_attacks import run_hin2vec_attacks

        source = csv if csv is not None else data
        assert source is not None  # _one_source: exactly one of them
        found = run_hin2vec_attacks(source, work, config_of(ctx, needs_secret=True), label=label,
                                    resamples=resamples)
        emit(found.to_markdown(), out, found)
        return
    if inversion_only and not inversion:
        raise UserError("--inversion-only and --no-inversion contradict each other")
    if inversion_only and gradient_inversion_only:
        raise UserError("--inversion-only and --gradient-inversion-only each run one section: pick one")
    epsilons = tuple(epsilon or ATTACK_EPSILONS)
    _positive_epsilons(epsilons)
    cfg = config_of(ctx)
    dp = cfg.federated.dp
    overrides: dict[str, object] = {"dp-delta": dp.delta, "dp-clipping-norm": dp.clipping_norm}
    for key, value in (("rounds", rounds), ("local-epochs", local_epochs)):
        if value is not None:
            overrides[key] = value
    result = run_attacks_bench(
        csv, work, epsilons, overrides=overrides, resamples=resamples, data=data, max_per_cardholder=per_cardholder,
        histograms=histograms, label=label, config=cfg, inversion=inversion, inversion_only=inversion_only,
        inversion_rows=inversion_rows, gradient_inversion=gradient_inversion,
        gradient_inversion_only=gradient_inversion_only, gradient_graphs=gradient_graphs,
        gradient_search=(gradient_steps, gradient_restarts),
    )
    emit(result.to_markdown(), out)


@bench_app.command("secagg")
def secagg(
    ctx: typer.Context,
    csv: CsvOption = None,
    data: DataOption = None,
    work: Annotated[Path, typer.Option("--work", help="data and caches go here")] = Path("out/bench-adversary"),
    rounds: Annotated[int, typer.Option("--rounds", min=1, help="rounds timed per path")] = 2,
    out: OutOption = None,
) -> None:
    """SecAgg+'s cost: wall time per round of the anomaly federation with and without it (5 banks)."""
    from fedfraud.bench.adversary import run_secagg_cost

    _one_source(csv, data)
    config_of(ctx)
    emit(run_secagg_cost(csv, work, rounds=rounds, data=data).to_markdown(), out)


@bench_app.command("anomaly-ablation")
def anomaly_ablation(
    ctx: typer.Context,
    csv: CsvOption = None,
    data: DataOption = None,
    work: Annotated[Path, typer.Option("--work", help="data goes here (one per CSV)")] = Path("out/bench-detection"),
    steps: Annotated[int, typer.Option("--steps", min=8, help="optimizer steps per variant")] = 240,
    scenarios: Annotated[
        Path | None, typer.Option("--scenarios", help="trans_num → scenario CSV: adds per-scenario ROC-AUCs")
    ] = None,
    group: Annotated[
        list[str] | None,
        typer.Option("--group", help="variant group, repeatable: graph (what the ego graph adds), readout"),
    ] = None,
    seeds: Annotated[int, typer.Option("--seeds", min=1, help="training seeds per variant (spread reported)")] = 1,
    rounds: Annotated[
        int, typer.Option("--rounds", min=1, help=">1: the steps in rounds, product LR schedule, best val-loss round")
    ] = 1,
    resamples: Annotated[int, typer.Option("--resamples", min=50, help="bootstrap resamples")] = 300,
    out: OutOption = None,
) -> None:
    """Encoder parts, readouts and negative mixes side by side on validation cardholders, each paired against the
    full model (where the defaults were chosen).
    """
    from fedfraud.bench.ablation import ABLATION_GROUPS, run_ablation

    _one_source(csv, data)
    if scenarios is not None:
        readable_file(scenarios)
    unknown = sorted(set(group or ()) - set(ABLATION_GROUPS))
    if unknown:
        raise UserError(f"--group {unknown[0]}: not one of {', '.join(ABLATION_GROUPS)}")
    variants = {k: v for g in (group or ABLATION_GROUPS) for k, v in ABLATION_GROUPS[g].items()}
    config_of(ctx)
    emit(run_ablation(csv, work, steps=steps, variants=variants, resamples=resamples, scenarios=scenarios,
                      seeds=seeds, data=data, rounds=rounds).to_markdown(), out)


@bench_app.command("anomaly-thesis")
def anomaly_thesis(
    ctx: typer.Context,
    quick: Annotated[bool, typer.Option("--quick", help="2 poolings, 200 cardholders, 2 rounds")] = False,
    data: Annotated[Path | None, typer.Option("--data", help="dataset dir (default: generate one)")] = None,
    eval_data: Annotated[Path | None, typer.Option("--eval-data", help="Sparkov CSV scored against its labels")] = None,
    work: Annotated[Path, typer.Option("--work", help="runs, registries and data go here")] = Path("out/bench-anomaly"),
    pooling: Annotated[list[str] | None, typer.Option("--pooling", help="restrict the table to these poolings")] = None,
    rounds: Annotated[int | None, typer.Option("--rounds", min=1, help="rounds per run (default 5; quick 2)")] = None,
    cardholders: Annotated[int | None, typer.Option("--cardholders", min=20, help="generated table data size")] = None,
    local_epochs: Annotated[int | None, typer.Option("--local-epochs", min=1, help="table runs' local epochs")] = None,
    demo: Annotated[bool, typer.Option("--demo/--no-demo", help="time the 5x5 demo-sized federation")] = True,
    out: OutOption = None,
) -> None:
    """Thesis readout f(q_prev, q_cur): Table 4.1 / Fig 4.3 equivalents, real-label AUCs, round and demo timing."""
    from fedfraud.bench.anomaly import run_anomaly_bench

    config_of(ctx)
    overrides = {"local-epochs": local_epochs} if local_epochs else {}
    result = run_anomaly_bench(work, quick=quick, data=data, eval_data=eval_data, poolings=pooling, rounds=rounds,
                               demo=demo, cardholders=cardholders, overrides=overrides)
    emit(result.to_markdown(), out)


@bench_app.command("console")
def console(
    ctx: typer.Context,
    decisions: Annotated[int, typer.Option("--decisions", min=100, help="decisions in the topic")] = 20_000,
    requests: Annotated[int, typer.Option("--requests", min=5, help="timed requests per row")] = 60,
    out: OutOption = None,
) -> None:
    """Analyst console: queue first-page and case-view p50/p95 over HTTP, beside a raw Kafka read of one page."""
    from fedfraud.bench.console import run_console_bench

    emit(run_console_bench(config_of(ctx, needs_secret=True), decisions=decisions, requests=requests).to_markdown(),
         out)


@bench_app.command("hin2vec")
def hin2vec(
    ctx: typer.Context,
    csv: CsvOption = None,
    data: DataOption = None,
    work: Annotated[Path, typer.Option("--work", help="data, the hin2vec registry and caches")] = Path(
        "out/bench-hin2vec"),
    rounds: Annotated[int | None, typer.Option("--rounds", min=1, help="G-HIN2Vec federated rounds")] = None,
    reps: Annotated[int, typer.Option("--reps", min=50, help="cardholder-bootstrap replicates")] = 300,
    label: Annotated[str, typer.Option("--label", help="heading label")] = "",
    out: OutOption = None,
) -> None:
    """Federated XGBoost vs federated XGBoost + G-HIN2Vec columns: validation, then one test look with intervals."""
    from fedfraud.bench.hin2vec import run_hin2vec_bench

    _one_source(csv, data)
    result = run_hin2vec_bench(csv or data, work, config_of(ctx, needs_secret=True), label=label, reps=reps,
                               rounds=rounds)
    emit(result.to_markdown(), out, result)


def register(app: typer.Typer) -> None:
    """Attach the ``bench`` group to the root CLI."""
    app.add_typer(bench_app, name="bench")
