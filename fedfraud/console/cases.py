"""One case: the decision and its transaction read back by offset, the cardholder's timeline, the ego graph and
merchant risk from the bank's online store, drawn with networkx and matplotlib.

The ego graph is the cardholder's *current* state in the online store (Feast, read through
:class:`fedfraud.feature_store.online.OnlineStateClient`, the scorer's own reader): the graph the next
transaction will extend. What the case's transaction added is marked: the node it created (its first visit is
the transaction's time) and the transition edges it closed. Nodes are keyed merchant hashes in the store; the
console names those it saw on the ``transactions`` topic (hashed with the bank's featurizer) and shows a short
hash for the others. Pictures are SVG from matplotlib with text drawn as paths, shown through ``<img>`` data
URIs: nothing in them is markup the browser runs.
"""

from __future__ import annotations

import base64
import io
import logging
import math
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from fedfraud.console.index import DecisionRow, LabelRow, OffsetReader, TopicIndex, TxRow, masked, rounded

if TYPE_CHECKING:
    from fedfraud.feature_store.egograph import EgoGraphState
    from fedfraud.feature_store.online import OnlineStateClient
    from fedfraud.feature_store.privacy import PrivateFeaturizer
    from fedfraud.training.registry import ModelRegistry

__all__ = ["Case", "CaseBuilder", "EgoSummary", "Reason", "ego_graph_svg", "reasons_view", "scores_svg",
           "svg_data_uri", "svg_figure"]

log = logging.getLogger(__name__)

#: Colours of the drawings (colour-blind safe: Okabe-Ito).
_OLD, _NEW, _EDGE = "#56B4E9", "#D55E00", "#999999"


@dataclass
class EgoSummary:
    """The ego graph of a case: counts, the picture, and the merchants the case's transaction added."""

    nodes: int = 0
    edges: int = 0
    transactions: int = 0
    new_nodes: list[str] = field(default_factory=list)
    new_edges: int = 0
    svg: str | None = None  # a data: URI
    note: str = ""


@dataclass(frozen=True)
class Reason:
    """One of a decision's top reasons as the case shows it: text masked, numbers finite or None."""

    feature: str
    value: float | str | None
    contribution: float | None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def reasons_view(record: Any) -> list[Reason]:
    """The decision record's ``top_reasons`` (at most 8) with every text field masked: the record is read back
    whole from the topic, so a card number a producer put in a feature name or value must not reach the page.
    """
    raw = record.get("top_reasons") if isinstance(record, dict) else None
    if not isinstance(raw, list):
        return []
    out = []
    for r in raw[:8]:
        if not isinstance(r, dict):
            continue
        value = r.get("value")
        shown: float | str | None = _number(value) if not isinstance(value, str) else masked(value, 64)
        out.append(Reason(masked(r.get("feature"), 64), shown, _number(r.get("contribution"))))
    return out


@dataclass
class Case:
    """Everything the case page shows, already reduced to what may be shown (token, rounded coordinates)."""

    decision: DecisionRow
    reasons: list[Reason]
    transaction: dict[str, Any] | None
    label: LabelRow | None
    timeline: list[tuple[TxRow, DecisionRow | None, LabelRow | None]]
    scores_svg: str | None
    ego: EgoSummary
    merchant_risk: list[tuple[str, float]] | None
    merchant_risk_day: str | None
    timings_ms: dict[str, float]


def svg_data_uri(fig: Any) -> str:
    """``fig`` as an SVG ``data:`` URI, shown through ``<img>`` (an image runs no script)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="svg")  # no bbox_inches="tight": it draws the figure twice (~40% of the time)
    return "data:image/svg+xml;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def svg_figure(width: float, height: float) -> Any:
    """A matplotlib figure without pyplot, set to draw text as outlines (no ``<text>`` in the SVG)."""
    from matplotlib import rcParams
    from matplotlib.figure import Figure  # no pyplot: no global state, safe in a server's threads

    rcParams["svg.fonttype"] = "path"  # text as outlines: an SVG with no <text> to inject into
    rcParams["svg.hashsalt"] = "fedfraud-console"
    return Figure(figsize=(width, height), dpi=96)


def _short(name: str, limit: int = 22) -> str:
    return name if len(name) <= limit else name[: limit - 1] + "…"


def ego_graph_svg(ego: EgoGraphState, names: dict[int, str], new_ts_us: int | None) -> tuple[str, list[str], int]:
    """The ego graph drawn (networkx layout and drawing on a matplotlib figure) as an SVG data URI, the names
    of the nodes created at ``new_ts_us`` and the number of edges closed then.
    """
    import networkx as nx

    graph = nx.MultiDiGraph()
    label: dict[int, str] = {}
    new_nodes: list[int] = []
    for i, merchant in enumerate(ego.node_merchant):
        graph.add_node(merchant)
        label[merchant] = _short(names.get(merchant, f"merchant {merchant & 0xFFFFFF:06x}"))
        if new_ts_us is not None and ego.node_first[i] == new_ts_us:
            new_nodes.append(merchant)
    new_edges: list[tuple[int, int, int]] = []
    for src, dst, ts in zip(ego.edge_src, ego.edge_dst, ego.edge_ts, strict=True):
        key = graph.add_edge(src, dst)
        if new_ts_us is not None and ts == new_ts_us:
            new_edges.append((src, dst, key))
    fig = svg_figure(6.4, 4.2)
    fig.subplots_adjust(left=0.02, right=0.98, bottom=0.02, top=0.93)
    ax = fig.add_subplot()
    ax.set_axis_off()
    if graph.number_of_nodes():
        pos = nx.circular_layout(graph) if graph.number_of_nodes() < 3 else nx.spring_layout(graph, seed=7)
        old_edges = [e for e in graph.edges(keys=True) if e not in new_edges]
        nx.draw_networkx_edges(graph, pos, ax=ax, edgelist=old_edges, edge_color=_EDGE, arrows=True,
                               connectionstyle="arc3,rad=0.12", node_size=500)
        if new_edges:
            nx.draw_networkx_edges(graph, pos, ax=ax, edgelist=new_edges, edge_color=_NEW, width=2.5, arrows=True,
                                   connectionstyle="arc3,rad=0.12", node_size=500)
        colours = [_NEW if n in new_nodes else _OLD for n in graph.nodes]
        nx.draw_networkx_nodes(graph, pos, ax=ax, node_color=colours, node_size=500)
        for node, (x, y) in pos.items():
            ax.text(x, y - 0.13, label[node], ha="center", va="top", fontsize=7, parse_math=False)
        ax.set_title(f"ego graph: {graph.number_of_nodes()} merchants, {graph.number_of_edges()} transitions "
                     "(orange: added by this transaction)", fontsize=8)
        ax.margins(0.15)
    return svg_data_uri(fig), [label[n] for n in new_nodes], len(new_edges)


def scores_svg(timeline: list[tuple[TxRow, DecisionRow | None, LabelRow | None]]) -> str | None:
    """Fraud and anomaly scores over the cardholder's timeline (matplotlib), or None with fewer than 2 points."""
    points = [(t.ts_us, d.score, d.anomaly_score) for t, d, _ in reversed(timeline) if d is not None and t.ts_us]
    if len(points) < 2:
        return None
    newest = points[-1][0]
    stamps = [(p[0] - newest) / 3.6e9 for p in points]  # hours: a numeric axis draws in half a date axis's time
    fig = svg_figure(6.4, 2.4)
    fig.subplots_adjust(left=0.1, right=0.88, bottom=0.22, top=0.95)
    ax = fig.add_subplot()
    ax.plot(stamps, [p[1] for p in points], marker="o", color=_NEW, label="fraud score")
    ax.set_ylim(-0.02, 1.02)
    ax.set_ylabel("fraud score")
    ax.set_xlabel("hours before the case's transaction")
    twin = ax.twinx()
    anomaly = [(s, p[2]) for s, p in zip(stamps, points, strict=True) if p[2] is not None]
    if anomaly:
        twin.plot([a[0] for a in anomaly], [a[1] for a in anomaly], marker="s", color=_OLD, label="anomaly score")
    twin.set_ylabel("anomaly score")
    handles = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    ax.legend(handles=handles, loc="upper left", fontsize=7)
    return svg_data_uri(fig)


def _transaction_view(value: Any) -> dict[str, Any] | None:
    """The fields of a ``transactions`` record the case shows: the card token only (never a card number),
    coordinates at 0.01°; the generator's ``is_fraud`` and anything else are left out.
    """
    from fedfraud.console.index import tx_row

    row = tx_row(0, 0, value)
    if row is None:
        return None
    return {"transaction_id": row.transaction_id, "card_token": row.cardholder, "merchant": row.merchant,
            "amount": row.amount, "mcc": row.mcc, "timestamp": row.timestamp,
            "lat": rounded(value.get("lat")), "lon": rounded(value.get("lon"))}


class CaseBuilder:
    """Assembles a :class:`Case` from the index, records read by offset, the online store and the registry.

    The store, featurizer and registry are optional: a console without them still shows the decision, the
    transaction and the timeline, and says what it could not read.
    """

    def __init__(self, index: TopicIndex, reader: OffsetReader, client: OnlineStateClient | None = None,
                 featurizer: PrivateFeaturizer | None = None, registry: ModelRegistry | None = None,
                 bank: int = 0, store_note: str = "") -> None:
        self.index = index
        self.reader = reader
        self.client = client
        self.featurizer = featurizer
        self.registry = registry
        self.bank = bank
        self.store_note = store_note

    def _risk_settings(self) -> Any:
        """The champion fraud model's merchant-risk settings (None: it has no merchant columns)."""
        if self.registry is None:
            return None
        from fedfraud.serving.fraud_stage import merchant_risk_for
        from fedfraud.training.registry import RegistryError

        try:
            return merchant_risk_for(self.registry.get("fraud", "champion").config)
        except RegistryError:
            return None

    def build(self, transaction_id: str) -> Case | None:
        """The case of ``transaction_id``, or None when the console has no decision of it."""
        timings: dict[str, float] = {}
        start = time.perf_counter()
        row = self.index.decision(transaction_id)
        if row is None:
            return None
        topics = self.index.topics
        record = self.reader.read(topics.decisions, row.partition, row.offset)
        tx = self.index.transaction(transaction_id)
        tx_value = self.reader.read(topics.transactions, tx.partition, tx.offset) if tx is not None else None
        timings["kafka_reads"] = (time.perf_counter() - start) * 1000
        mark = time.perf_counter()
        timeline = self.index.timeline(row.cardholder, until_us=tx.ts_us if tx else None)
        if not timeline:
            timeline = self.index.timeline(row.cardholder)
        chart = scores_svg(timeline)
        timings["timeline"] = (time.perf_counter() - mark) * 1000
        mark = time.perf_counter()
        ego, risk, risk_day = self._store_parts(row, tx)
        timings["store_and_graph"] = (time.perf_counter() - mark) * 1000
        timings["total"] = (time.perf_counter() - start) * 1000
        return Case(decision=row, reasons=reasons_view(record),
                    transaction=_transaction_view(tx_value), label=self.index.label(transaction_id),
                    timeline=timeline, scores_svg=chart, ego=ego, merchant_risk=risk, merchant_risk_day=risk_day,
                    timings_ms={k: round(v, 1) for k, v in timings.items()})

    def _store_parts(self, row: DecisionRow, tx: TxRow | None
                     ) -> tuple[EgoSummary, list[tuple[str, float]] | None, str | None]:
        if self.client is None or self.featurizer is None:
            return EgoSummary(note=self.store_note or "no feature store configured"), None, None
        merchants = {t.merchant for t, _, _ in self.index.timeline(row.cardholder, limit=200)}
        names = dict(zip((int(h) for h in self.featurizer.merchant_hash(list(merchants))), merchants, strict=True)) \
            if merchants else {}
        risk = self._risk_settings()
        bucket = None
        if risk is not None and tx is not None:
            bucket = int(self.featurizer.merchant_hash([tx.merchant])[0]) % risk.buckets
        try:
            states, risk_rows = self.client.read_batch([row.cardholder], self.bank, [bucket] if bucket is not None
                                                       else [])
        except Exception as exc:  # noqa: BLE001 - the store down: the rest of the case still shows
            log.warning("console: online store read failed: %s", exc)
            return EgoSummary(note=f"online store not readable ({exc.__class__.__name__})"), None, None
        state = states[0]
        summary = EgoSummary(nodes=state.ego.num_nodes, edges=state.ego.num_edges,
                             transactions=state.ego.n_transactions)
        if not state.found:
            summary.note = "this card has no ego graph in the online store"
        elif state.rebuilt:
            summary.note = "the stored ego graph was corrupt"
        else:
            summary.svg, summary.new_nodes, summary.new_edges = ego_graph_svg(
                state.ego, names, tx.ts_us if tx is not None else None)
        risk_view: list[tuple[str, float]] | None = None
        risk_day: str | None = None
        if risk is not None and risk_rows and risk_rows[0] is not None:
            from fedfraud.training.merchant_risk.features import merchant_names, row_columns

            values = row_columns(risk_rows, risk)[0]
            risk_view = [(name, float(v)) for name, v in zip(merchant_names(risk), values, strict=True)]
            day = risk_rows[0].get("release_day")
            risk_day = datetime.fromtimestamp(int(day) * 86_400, UTC).date().isoformat() if day is not None else None
        return summary, risk_view, risk_day
