"""``fedfraud tokenizer train|eval|serve``: the federated byte-level BPE tokenizer."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer

from fedfraud.cli.common import config_of, readable_file
from fedfraud.config import update_section
from fedfraud.core.errors import UserError

__all__ = ["register", "tokenizer_app"]

log = logging.getLogger(__name__)

tokenizer_app = typer.Typer(name="tokenizer", help="Federated byte-level BPE tokenizer.", no_args_is_help=True)

RegistryOption = Annotated[Path, typer.Option("--registry", help="model registry folder")]
CorpusOption = Annotated[
    Path | None,
    typer.Option("--corpus", help="CFPB complaints CSV or a generated .jsonl; default: generate one (seeded)"),
]


def _clients(corpus: Path | None, cfg, work: Path) -> tuple[Path, dict[str, list[str]]]:  # noqa: ANN001
    """A JSONL corpus path for the Flower clients plus ``{client: raw texts}``."""
    from fedfraud.training.tokenizer.corpus import (
        Document,
        generate_corpus,
        group_by_client,
        load_cfpb_csv,
        read_jsonl,
        write_jsonl,
    )

    if corpus is None:
        docs = generate_corpus(cfg.clients, cfg.docs_per_client, pii_rate=cfg.pii_rate, seed=cfg.seed)
    elif corpus.suffix == ".jsonl":
        docs = list(read_jsonl(readable_file(corpus)))
    else:
        by_company = load_cfpb_csv(readable_file(corpus), max_clients=cfg.clients)
        docs = [Document(c, t) for c, texts in by_company.items() for t in texts]
    path = write_jsonl(work / "corpus.jsonl", docs)
    return path, group_by_client(docs)


@tokenizer_app.command("train")
def train(
    ctx: typer.Context,
    registry: RegistryOption = Path("out/registry"),
    corpus: CorpusOption = None,
    vocab_size: Annotated[int | None, typer.Option("--vocab-size", help="overrides tokenizer.vocab_size")] = None,
    mode: Annotated[str | None, typer.Option("--mode", help="single, batched or histogram")] = None,
    backend: Annotated[str, typer.Option(
        "--backend", help="flower (the Flower apps on tokenizer.engine: simulation on Ray, or loopback in this "
        "process) or inprocess (direct calls, no messages)")] = "flower",
    work: Annotated[Path, typer.Option("--work", help="scratch folder")] = Path("out/tokenizer"),
    no_privacy: Annotated[
        bool, typer.Option("--no-privacy", help="release exact counts: no noise, no DP (printed in the card)")
    ] = False,
) -> None:
    """Train FedByteBPE across institutions and publish ``tokenizer.json`` in the registry."""
    cfg = update_section(config_of(ctx), "tokenizer", vocab_size=vocab_size, mode=mode).tokenizer
    if backend not in ("flower", "inprocess"):
        raise UserError(f"unknown backend {backend!r}; valid: flower, inprocess")
    from fedfraud.training.tokenizer.evaluate import compare, hf_counter
    from fedfraud.training.tokenizer.pretokenize import CorpusPipeline
    from fedfraud.training.tokenizer.trainer import publish_tokenizer, train_federated_flower, train_federated_inprocess

    work.mkdir(parents=True, exist_ok=True)
    path, clients = _clients(corpus, cfg, work)
    documents = sum(len(t) for t in clients.values())
    if cfg.delta is not None and cfg.delta > 1.0 / documents:
        raise UserError(f"tokenizer.delta={cfg.delta:g} is above 1/documents ({1.0 / documents:.3g}): no guarantee")
    if backend == "flower":
        run = train_federated_flower(cfg, path, num_supernodes=len(clients), privacy=not no_privacy)
    else:
        run = train_federated_inprocess(cfg, clients, privacy=not no_privacy)
    pipe = CorpusPipeline()
    masked = {c: pipe.masked_texts(t) for c, t in clients.items()}
    row = compare(masked, [("federated", run.vocab_size, lambda _c: hf_counter(run.tokenizer))])[0]
    metrics = {k: v[0] for k, v in row.mean().items()} | {"rounds": run.rounds, "train_seconds": run.train_seconds}
    reached = run.vocab_size
    card = "\n".join([
        f"FedByteBPE tokenizer ({cfg.mode} mode) trained on {len(clients)} institutions; stopped: {run.stop_reason}.",
        *(["", f"**Vocabulary**: reached {reached:,} of the {cfg.vocab_size:,} asked for ({run.stop_reason})."]
          if reached < cfg.vocab_size else []),
        "",
        f"**Privacy**: {_privacy_line(run.privacy)}",
    ])
    version = publish_tokenizer(registry, run.tokenizer, cfg, metrics=metrics, privacy=run.privacy, card=card)
    typer.echo(f"published {version.tag} vocab={run.vocab_size} rounds={run.rounds} stop='{run.stop_reason}'")
    typer.echo(f"privacy: {_privacy_line(run.privacy)}")


def _privacy_line(privacy: dict) -> str:  # type: ignore[type-arg]
    """One sentence for the card and the terminal: the composed (ε, δ) per document, or that privacy was off."""
    if privacy.get("privacy") != "on":
        return str(privacy.get("privacy"))
    if "tau" in privacy:  # histogram mode: one release per client
        return (
            f"({privacy['epsilon']:.3g}, {privacy['delta']:.2g})-DP per document over all "
            f"{privacy['releases_per_client']} release of a client: {privacy['mechanism']}; k = {privacy['k']}, "
            f"c = {privacy['c']}, σ = {privacy['sigma']:.4g}, τ = {privacy['tau']:.4g} ({privacy['accountant']})"
        )
    return (
        f"({privacy['epsilon']:.3g}, {privacy['delta']:.2g})-DP per document over all "
        f"{privacy['releases_per_client']} releases of a client ({privacy['epsilon_per_release']:g} per release, "
        f"{privacy['accountant']})"
    )


@tokenizer_app.command("eval")
def evaluate(
    ctx: typer.Context,
    registry: RegistryOption = Path("out/registry"),
    version: Annotated[str, typer.Option("--version", help="registry version, e.g. v2 or latest")] = "latest",
    corpus: CorpusOption = None,
    local: Annotated[bool, typer.Option("--local/--no-local", help="also train one local tokenizer per client")] = True,
    work: Annotated[Path, typer.Option("--work", help="scratch folder")] = Path("out/tokenizer"),
) -> None:
    """Print psi and Pi per tokenizer: federated (registry), centralized, local and public."""
    cfg = config_of(ctx).tokenizer
    from tokenizers import Tokenizer

    from fedfraud.training.registry import ModelRegistry
    from fedfraud.training.tokenizer.evaluate import compare, hf_counter, public_counter, to_markdown
    from fedfraud.training.tokenizer.export import TOKENIZER_FILE
    from fedfraud.training.tokenizer.pretokenize import CorpusPipeline
    from fedfraud.training.tokenizer.trainer import train_centralized

    found = ModelRegistry(registry).get("tokenizer", version)
    fed = Tokenizer.from_file(str(found.file(TOKENIZER_FILE)))
    work.mkdir(parents=True, exist_ok=True)
    _, clients = _clients(corpus, cfg, work)
    pipe = CorpusPipeline()
    masked = {c: pipe.masked_texts(t) for c, t in clients.items()}
    size = fed.get_vocab_size()
    central = train_centralized([t for ts in masked.values() for t in ts], size, cfg.special_tokens)
    rows = [
        (f"federated {found.tag}", size, lambda _c: hf_counter(fed)),
        ("centralized (BpeTrainer)", central.get_vocab_size(), lambda _c: hf_counter(central)),
    ]
    if local:
        locals_ = {c: train_centralized(t, size, cfg.special_tokens) for c, t in masked.items()}
        rows.append(("local (own client)", size, lambda c: hf_counter(locals_[c])))
    public = public_counter()
    if public is not None:
        name, counter, n_vocab = public
        rows.append((name, n_vocab, lambda _c: counter))
    typer.echo(to_markdown(compare(masked, rows)))


@tokenizer_app.command("serve")
def serve_cmd(
    ctx: typer.Context,
    registry: RegistryOption = Path("out/registry"),
    port: Annotated[int, typer.Option("--port")] = 8000,
    host: Annotated[str, typer.Option("--host")] = "127.0.0.1",
    version: Annotated[str, typer.Option("--version")] = "latest",
    insecure_no_auth: Annotated[bool, typer.Option(
        "--insecure-no-auth", help="local development only: no bearer token on the endpoints")] = False,
) -> None:
    """Serve /tokenize, /detokenize and /tokenizer with Ray Serve until interrupted.

    Every endpoint needs ``Authorization: Bearer $FEDFRAUD_API_TOKEN`` (or the token in
    ``serving.auth.token_file``); without a token configured the command refuses to start, and
    ``--insecure-no-auth`` (or ``serving.auth.disabled``) is refused on a ``--host`` other than loopback.
    Bodies are capped at ``serving.guards.http_max_body_bytes``, requests at ``serving.http_request_timeout_s``.
    """
    import time

    import ray
    from ray import serve

    from fedfraud.core.net import ray_bind
    from fedfraud.serving.auth import check_open_http
    from fedfraud.serving.tokenizer_service import TokenizerServiceArgs, build_tokenizer_app

    serving_cfg = config_of(ctx).serving
    auth = serving_cfg.auth.model_copy(update={"disabled": True}) if insecure_no_auth else serving_cfg.auth
    check_open_http(auth, host)  # before anything starts: no open endpoint beyond loopback
    app = build_tokenizer_app(TokenizerServiceArgs(registry_root=str(registry), version=version, auth=auth,
                                                   max_body_bytes=serving_cfg.guards.http_max_body_bytes))
    ray.init(ignore_reinit_error=True, **ray_bind(serving_cfg.ray_host))
    serve.start(http_options={"host": host, "port": port, "request_timeout_s": serving_cfg.http_request_timeout_s})
    serve.run(app, name="tokenizer", route_prefix="/")
    typer.echo(f"tokenizer service on http://{host}:{port} "
               f"({'NO AUTHENTICATION' if auth.disabled else 'bearer token required'}; Ctrl-C to stop)")
    try:
        while True:
            time.sleep(3600)
    finally:
        serve.shutdown()
        ray.shutdown()


def register(app: typer.Typer) -> None:
    """Attach ``fedfraud tokenizer``."""
    app.add_typer(tokenizer_app, name="tokenizer")
