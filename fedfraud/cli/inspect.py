"""``fedfraud inspect``: print one cardholder's ego graph as text (bank-internal debugging)."""

from __future__ import annotations

from datetime import datetime, UTC
from pathlib import Path
from typing import Annotated

import typer

from fedfraud.cli.common import config_of, existing_dir
from fedfraud.core.errors import UserError

__all__ = ["register"]

_HELP = (
    "Replay a cardholder's transactions through the ego-graph update and print the graph: nodes "
    "(merchant, location, first/last visit), edges (src → dst, time) and counts. This is a bank-internal "
    "debugging tool: it reads raw data and SHOWS RAW VALUES (ids, coordinates, timestamps); never run it "
    "on behalf of another bank or paste its output outside the bank."
)


def _iso(ts_us: int) -> str:
    return datetime.fromtimestamp(ts_us / 1e6, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


def register(app: typer.Typer) -> None:
    """Attach ``inspect`` to the root CLI."""

    @app.command("inspect", help=_HELP)
    def inspect(
        ctx: typer.Context,
        data: Annotated[Path, typer.Option("--data", help="dataset directory (bank_<k>/transactions.parquet)")],
        cardholder: Annotated[str, typer.Option("--cardholder", help="raw cardholder id")],
        bank: Annotated[int | None, typer.Option("--bank", help="bank id (default: search every bank)")] = None,
        at: Annotated[
            str | None, typer.Option("--at", help="stop after this transaction id (default: all transactions)")
        ] = None,
    ) -> None:
        import numpy as np

        from fedfraud.feature_store.egograph import EgoGraphState
        from fedfraud.feature_store.encoders import timestamps_us
        from fedfraud.feature_store.privacy import PrivateFeaturizer
        from fedfraud.feature_store.layout import list_banks, read_bank

        cfg = config_of(ctx, needs_secret=True)
        existing_dir(data, "data directory")
        banks = [bank] if bank is not None else list_banks(data)
        rows = None
        for k in banks:
            frame = read_bank(data, k)
            hit = frame[frame["cardholder_id"].astype(str) == cardholder]
            if len(hit):
                rows, bank = hit, k
                break
        if rows is None or bank is None:
            where = f"bank {banks[0]}" if len(banks) == 1 else f"banks {', '.join(map(str, banks))}"
            raise UserError(f"cardholder {cardholder!r} not found in {where} of {data}")
        rows = rows.sort_values(["timestamp", "transaction_id"], kind="stable").reset_index(drop=True)
        if at is not None:
            match = np.flatnonzero(rows["transaction_id"].astype(str).to_numpy() == at)
            if not match.size:
                raise UserError(f"transaction {at!r} is not one of cardholder {cardholder!r}'s transactions")
            rows = rows.iloc[: int(match[0]) + 1]

        featurizer = PrivateFeaturizer.for_bank(cfg.encoder, cfg.privacy, bank)
        keys = featurizer.noise_keys(rows["transaction_id"]).tolist()
        merchants = featurizer.merchant_hash(rows["merchant_id"]).tolist()
        ts_us = timestamps_us(rows["timestamp"]).tolist()
        state = EgoGraphState(cfg.egograph)
        columns = (keys, merchants, rows["lat"], rows["lon"], ts_us, rows["amount"], rows["mcc"].astype(str))
        for key, m, lat, lon, ts, amount, mcc in zip(*columns, strict=True):
            state.update(key, m, lat, lon, ts, amount, mcc)
        names = dict(zip(merchants, rows["merchant_id"].astype(str), strict=True))
        eps = float(featurizer.epsilon([cardholder])[0])

        typer.echo(f"cardholder {cardholder} (bank {bank}) — raw values, bank-internal")
        typer.echo(
            f"transactions={state.n_transactions} nodes={state.num_nodes} edges={state.num_edges} "
            f"state_bytes={len(state.to_bytes())} epsilon={eps:.3f} "
            f"last={_iso(state.last_ts) if state.last_ts is not None else '-'}"
        )
        typer.echo("nodes:")
        for i in range(state.num_nodes):
            typer.echo(
                f"  [{i:>2}] {names.get(state.node_merchant[i], '?'):<28} "
                f"loc=({state.node_lat[i]:.2f},{state.node_lon[i]:.2f}) visits={state.node_visits[i]:<4} "
                f"first={_iso(state.node_first[i])} last={_iso(state.node_last[i])}"
            )
        typer.echo("edges:")
        index = {m: i for i, m in enumerate(state.node_merchant)}
        for s, t, ts in zip(state.edge_src, state.edge_dst, state.edge_ts, strict=True):
            typer.echo(f"  [{index[s]:>2}] → [{index[t]:>2}] at {_iso(ts)}  {names.get(s, '?')} → {names.get(t, '?')}")
