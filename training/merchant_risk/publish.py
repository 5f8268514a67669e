"""The daily merchant-risk job: make the day's release and land it in Feast, where training's columns come from.

``fedfraud features merchant-risk`` runs it on the retraining schedule. For release day ``r`` every bank computes
its release vector (:func:`~.stats.release_vector`, labels as they had come back by the end of ``r``), the banks'
noise shares are summed as SecAgg+ sums them (:func:`~.release.private_release`), and each bank writes its
``merchant_risk`` rows (:func:`~.features.table_rows`: its own counts and the mean of the latest releases) to the
online store, which serving reads with the cardholder states from the next transaction on.

In this simulation every bank's rows are in one dataset folder, so the job replays the releases from the first
day of the data (the mean needs the latest ``release_average`` of them) in one process; a deployment runs the
Flower app (:mod:`.release_app`, ``apps/merchant_release``) across the banks' SuperNodes for the day's sum.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from fedfraud.training.merchant_risk.features import bank_activity, table_rows
from fedfraud.training.merchant_risk.release import plan_release, private_release, release_privacy_card
from fedfraud.training.merchant_risk.stats import DAY_S, release_vector

if TYPE_CHECKING:
    from fedfraud.config import FedfraudConfig
    from fedfraud.feature_store.online import OnlineStateClient

__all__ = ["Published", "publish_release"]

logger = logging.getLogger(__name__)


@dataclass
class Published:
    """What one run of the job did: the release day, rows per bank, the privacy card, the top flagged merchants."""

    release_day: int
    rows: dict[int, int]
    card: dict[str, Any]
    flagged: pd.DataFrame = field(default_factory=pd.DataFrame)

    @property
    def date(self) -> str:
        """The release day as an ISO date (UTC)."""
        return pd.Timestamp(self.release_day * DAY_S, unit="s").date().isoformat()


def publish_release(cfg: FedfraudConfig, root: Path, client: OnlineStateClient | None, day: str | None = None,
                    rng: np.random.Generator | None = None, top: int = 10, progress: bool = True) -> Published:
    """Make release ``day`` (default: the last day of the data) and write every bank's ``merchant_risk`` rows.

    ``client``: the online store to write (None: compute only). ``rng``: the banks' noise (default: fresh OS
    entropy, as a bank's own share must be). ``flagged``: per bank, its ``top`` own merchants by the federation's
    averaged frauds at their bucket (a bank maps a bucket back to its own merchants; the server cannot).
    """
    from fedfraud.feature_store.layout import list_banks, read_bank

    risk, noise = cfg.merchant_risk, cfg.merchant_noise
    columns = ["cardholder_id", "merchant_id", "timestamp", "is_fraud"]
    frames = {b: read_bank(root, b, columns=columns) for b in list_banks(root)}
    banks = {b: bank_activity(f, b, cfg.encoder, cfg.privacy, risk) for b, f in frames.items()}
    days = [a.day for a in banks.values() if len(a)]
    if not days:
        raise ValueError(f"no transactions under {root}")
    first, last = min(int(d[0]) for d in days), max(int(d[-1]) for d in days)
    release_day = last if day is None else int(pd.Timestamp(day, tz="UTC").value // 1_000_000_000 // DAY_S)
    if not first - 1 <= release_day <= last:
        raise ValueError(f"release day {day} is outside the data ({_iso(first)} .. {_iso(last)})")
    plan = plan_release(risk, noise, len(banks))
    rng = rng or np.random.default_rng()
    recent: deque[np.ndarray] = deque(maxlen=risk.release_average)
    order = sorted(banks)
    for r in tqdm(range(first - 1, release_day + 1), desc="merchant releases", disable=not progress,
                  mininterval=2.0):
        recent.append(private_release([release_vector(banks[b], r, risk) for b in order], plan, rng))
    rows: dict[int, int] = {}
    flagged = []
    mean = np.mean([np.asarray(x, dtype=np.float64) for x in recent], axis=0)
    lead = mean[risk.released_stats.index("frauds") if "frauds" in risk.released_stats else 0]
    for b in order:
        table = table_rows(banks[b], release_day, list(recent), risk)
        if client is not None:
            client.push_merchant_risk(b, release_day, table.buckets.tolist(), table.own, table.fed)
        rows[b] = int(table.buckets.size)
        # the bank's own merchants, ranked by the federation's (averaged, noised) frauds at their bucket
        mine = pd.DataFrame({"bank": b, "merchant_id": frames[b]["merchant_id"].astype(str),
                             "bucket": banks[b].bucket[np.argsort(banks[b].row)]}).drop_duplicates("merchant_id")
        mine = mine.assign(fed_frauds=lead[mine["bucket"].to_numpy()])
        flagged.append(mine.nlargest(top, "fed_frauds") if top else mine.iloc[:0])
    card = release_privacy_card(risk, noise, len(banks))
    logger.info("merchant_risk_published release_day=%s banks=%d rows=%d epsilon_per_release=%s", _iso(release_day),
                len(order), sum(rows.values()), card["epsilon_per_release"])
    flagged_frame = pd.concat(flagged, ignore_index=True).sort_values("fed_frauds", ascending=False) if flagged \
        else pd.DataFrame()
    return Published(release_day, rows, card, flagged_frame)


def _iso(day: int) -> str:
    return pd.Timestamp(day * DAY_S, unit="s").date().isoformat()
