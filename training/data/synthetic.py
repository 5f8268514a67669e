"""Seeded synthetic multi-bank card transactions with labelled fraud scenarios (``fedfraud generate``).

The world: eight US metro areas (real approximate coordinates and UTC
offsets), each with ``merchants_per_region`` merchants that have a Sparkov
category, coordinates within ~15 km of the metro centre and a price level.
Cardholders live in one metro, keep a personal set of favourite merchants
(so ego graphs see revisits), follow a personal hour-of-day and weekly
rhythm, shop in *sessions* (a few purchases minutes apart, so the 2-hour
ego-graph window produces edges) and sometimes travel to another metro for a
few days, legitimately. Banks differ (non-IID): each draws most of its
customers from its own home metros and has its own spend level, activity
level and category mix.

Fraud scenarios are mixed to hit ``fraud_rate``; ``docs/data.md`` has the
table of how each is generated and the signal it leaves. The scenario of
every row is kept out of the canonical file, in ``bank_<k>/labels.parquet``.

Everything is vectorised numpy driven by one seed, so the same seed gives
byte-identical parquet. Output goes through the same Validator and writer
as ``ingest``: all data is judged in one place.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedfraud.feature_store.geo import haversine_km
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm.auto import tqdm

from fedfraud.feature_store.schema import CANONICAL_COLUMNS, Validator, demographics_of, luhn_ok
from fedfraud.training.data.config import BanksConfig, GeneratorConfig
from fedfraud.training.data.geo import GEO_EXACT
from fedfraud.feature_store.layout import TRANSACTIONS_FILE, bank_dir
from fedfraud.training.data.sparkov import write_sparkov_csv
from fedfraud.training.data.writer import LABELS_FILE, DatasetWriter

__all__ = [
    "CATEGORIES",
    "FRAUD_SCENARIOS",
    "RAW_CSV",
    "REGIONS",
    "GenerateReport",
    "Region",
    "generate_dataset",
    "generate_frame",
    "write_sparkov_csv",
]

logger = logging.getLogger(__name__)

#: Raw Sparkov pipe-delimited copy of the data, relative to the dataset dir.
RAW_CSV = Path("raw") / "transactions.csv"
_CHUNK = 200_000
_LABELS_SCHEMA = pa.schema([("transaction_id", pa.string()), ("scenario", pa.string())])
_DAY = 86_400


@dataclass(frozen=True)
class Region:
    """A metro area: home of cardholders and merchants."""

    code: str
    city: str
    state: str
    lat: float
    lon: float
    utc_offset: int
    population: int
    zip3: str


REGIONS: tuple[Region, ...] = (
    Region("nyc", "New York", "NY", 40.7128, -74.0060, -5, 8_300_000, "100"),
    Region("chi", "Chicago", "IL", 41.8781, -87.6298, -6, 2_700_000, "606"),
    Region("atl", "Atlanta", "GA", 33.7490, -84.3880, -5, 500_000, "303"),
    Region("mia", "Miami", "FL", 25.7617, -80.1918, -5, 450_000, "331"),
    Region("dal", "Dallas", "TX", 32.7767, -96.7970, -6, 1_300_000, "752"),
    Region("den", "Denver", "CO", 39.7392, -104.9903, -7, 715_000, "802"),
    Region("lax", "Los Angeles", "CA", 34.0522, -118.2437, -8, 3_900_000, "900"),
    Region("sea", "Seattle", "WA", 47.6062, -122.3321, -8, 740_000, "981"),
)


@dataclass(frozen=True)
class Category:
    """A Sparkov merchant category: share of merchants, lognormal amount (median, sigma), online or not."""

    name: str
    share: float
    median: float
    sigma: float
    online: bool = False


CATEGORIES: tuple[Category, ...] = (
    Category("gas_transport", 0.12, 48.0, 0.45),
    Category("grocery_pos", 0.13, 62.0, 0.55),
    Category("home", 0.09, 38.0, 0.90),
    Category("shopping_pos", 0.09, 45.0, 1.00),
    Category("kids_pets", 0.08, 32.0, 0.80),
    Category("shopping_net", 0.08, 40.0, 1.00, online=True),
    Category("entertainment", 0.07, 28.0, 0.80),
    Category("food_dining", 0.08, 24.0, 0.70),
    Category("personal_care", 0.07, 18.0, 0.80),
    Category("health_fitness", 0.06, 30.0, 0.70),
    Category("misc_pos", 0.06, 20.0, 1.00),
    Category("misc_net", 0.05, 12.0, 1.00, online=True),
    Category("grocery_net", 0.03, 45.0, 0.50, online=True),
    Category("travel", 0.03, 90.0, 1.20),
)
_CAT_INDEX = {c.name: i for i, c in enumerate(CATEGORIES)}
_ONLINE = np.array([c.online for c in CATEGORIES])
_LOG_MEDIAN = np.log([c.median for c in CATEGORIES])
_SIGMA = np.array([c.sigma for c in CATEGORIES])

#: Scenario name → share of fraudulent transactions it contributes.
FRAUD_SCENARIOS: dict[str, float] = {
    "card_testing": 0.20,
    "account_takeover": 0.30,
    "compromised_merchant": 0.25,
    "lost_stolen": 0.25,
}
_LEGIT, _TRAVEL = "legit", "travel"
_SCENARIO_NAMES = (_LEGIT, _TRAVEL, *FRAUD_SCENARIOS)

#: Local hour-of-day activity (midnight first): quiet nights, lunch and evening peaks.
_HOUR_PROFILE = np.array(
    [0.30, 0.20, 0.15, 0.10, 0.10, 0.20, 0.60, 1.20, 1.80, 1.80, 2.00, 2.40,
     3.00, 2.80, 2.20, 2.20, 2.60, 3.20, 3.40, 3.00, 2.40, 1.80, 1.10, 0.60]
)  # fmt: skip
#: Weekly rhythm, Monday first: busier Friday/Saturday.
_WEEK_PROFILE = np.array([1.00, 0.95, 1.00, 1.05, 1.20, 1.30, 0.90])
_SESSION_SIZES = np.array([1, 2, 3, 4])
_SESSION_P = np.array([0.50, 0.30, 0.15, 0.05])
_N_FAVOURITES = 12
_P_EXPLORE = 0.12
_P_TRAVEL_LOCAL = 0.9
_HOME_REGION_SHARE = 0.8


@dataclass(frozen=True)
class GenerateReport:
    """What ``generate_dataset`` produced."""

    out: Path
    transactions: int
    fraud: int
    per_bank: dict[int, int]
    scenarios: dict[str, int]
    rejected: int
    seconds: float
    raw_csv: Path | None = None

    def __post_init__(self) -> None:
        if sum(self.per_bank.values()) != self.transactions:
            raise ValueError("per-bank rows must sum to transactions")
        if self.fraud > self.transactions:
            raise ValueError("more fraud than transactions")


# --------------------------------------------------------------------------- world and people


@dataclass(frozen=True)
class _World:
    m_region: np.ndarray
    m_cat: np.ndarray
    m_lat: np.ndarray
    m_lon: np.ndarray
    m_price: np.ndarray
    m_id: np.ndarray
    per_region: int
    region_dist: np.ndarray  # km between metro centres

    def in_region(self, region: int, cats: list[int] | None = None) -> np.ndarray:
        """Merchant indices of a region, optionally restricted to categories."""
        idx = np.arange(region * self.per_region, (region + 1) * self.per_region)
        return idx if cats is None else idx[np.isin(self.m_cat[idx], cats)]


@dataclass(frozen=True)
class _People:
    bank: np.ndarray
    home: np.ndarray
    home_lat: np.ndarray
    home_lon: np.ndarray
    spend: np.ndarray
    rate: np.ndarray
    hour_cdf: np.ndarray
    week: np.ndarray
    fav: np.ndarray
    fav_cdf: np.ndarray
    trip_region: np.ndarray
    trip_start: np.ndarray
    trip_days: np.ndarray
    card: np.ndarray = field(repr=False)


_SURNAMES = (
    "Kirlin", "Sporer", "Rippin", "Heller", "Lind", "Kutch", "Keeling", "Haley", "Stracke", "Abbott", "Bauch",
    "Corwin", "Dare", "Ebert", "Fisher", "Gislason", "Hahn", "Jast", "Kozey", "Lesch", "Mertz", "Nader",
    "Osinski", "Pouros", "Quitzon", "Runolfsdottir", "Schmitt", "Torphy", "Upton", "Volkman", "Wisoky", "Yundt",
    "Zieme", "Boyer", "Cronin", "Doyle", "Emard", "Feil", "Grant", "Hills",
)  # fmt: skip
_SUFFIXES = ("and Sons", "Group", "LLC", "Inc", "Ltd", "PLC", "Market", "Store", "Co", "Partners")


def _build_world(config: GeneratorConfig, rng: np.random.Generator) -> _World:
    m, n_regions = config.merchants_per_region, len(REGIONS)
    shares = np.array([c.share for c in CATEGORIES])
    cats = []
    for _ in range(n_regions):
        # every category at least once per region, the rest by share
        extra = rng.choice(len(CATEGORIES), size=max(m - len(CATEGORIES), 0), p=shares / shares.sum())
        cats.append(rng.permutation(np.r_[np.arange(len(CATEGORIES)), extra])[:m])
    m_cat = np.concatenate(cats)
    m_region = np.repeat(np.arange(n_regions), m)
    r_lat = np.array([r.lat for r in REGIONS])[m_region]
    r_lon = np.array([r.lon for r in REGIONS])[m_region]
    m_lat = np.round(r_lat + rng.normal(0, 0.08, m_region.size), 6)
    m_lon = np.round(r_lon + rng.normal(0, 0.10, m_region.size), 6)
    m_price = rng.lognormal(0.0, 0.2, m_region.size)
    names = rng.integers(0, len(_SURNAMES), m_region.size)
    suffixes = rng.integers(0, len(_SUFFIXES), m_region.size)
    m_id = np.array(
        [f"{_SURNAMES[a]} {_SUFFIXES[b]} {REGIONS[r].code.upper()}-{k % m:04d}"
         for k, (a, b, r) in enumerate(zip(names, suffixes, m_region, strict=True))],
        dtype=object,
    )
    lat, lon = np.array([r.lat for r in REGIONS]), np.array([r.lon for r in REGIONS])
    dist = haversine_km(lat[:, None], lon[:, None], lat[None, :], lon[None, :])
    return _World(m_region, m_cat, m_lat, m_lon, m_price, m_id, m, dist)


def _bank_regions(banks: int) -> list[np.ndarray]:
    """Home metros of each bank: metros dealt round-robin (a bank beyond the metro count shares one)."""
    n = len(REGIONS)
    return [np.arange(n)[np.arange(n) % banks == b] if b < n else np.array([b % n]) for b in range(banks)]


def _cdf(weights: np.ndarray) -> np.ndarray:
    cdf = np.cumsum(weights, axis=1)
    cdf /= cdf[:, -1:]
    cdf[:, -1] = 1.0
    return cdf


def _sample_rows(cdf: np.ndarray, rows: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Inverse-CDF sampling with a different categorical per row, in one searchsorted."""
    k = cdf.shape[1]
    flat = (cdf + np.arange(cdf.shape[0])[:, None]).ravel()
    idx = np.searchsorted(flat, rows + u, side="right") - rows * k
    return np.clip(idx, 0, k - 1)


def _with_check_digit(partial: str) -> str:
    """``partial`` + its Luhn check digit: 16-digit card numbers that pass Luhn, like real ones."""
    return next(partial + d for d in "0123456789" if luhn_ok(partial + d))


def _build_people(config: GeneratorConfig, world: _World, rng: np.random.Generator) -> _People:
    n, banks, n_regions = config.cardholders, config.banks, len(REGIONS)
    # Bank traits (non-IID): market share, spend, activity, category tilt.
    share = rng.dirichlet(np.full(banks, 8.0))
    bank_spend = rng.lognormal(0.0, 0.35, banks)
    bank_activity = rng.lognormal(0.0, 0.25, banks)
    bank_tilt = rng.lognormal(0.0, 0.4, (banks, len(CATEGORIES)))
    bank = rng.choice(banks, size=n, p=share)
    regions_of = _bank_regions(banks)
    own = np.array([rng.choice(regions_of[b]) for b in bank]) if n else np.zeros(0, int)
    home = np.where(rng.random(n) < _HOME_REGION_SHARE, own, rng.integers(0, n_regions, n))
    home_lat = np.round(np.array([r.lat for r in REGIONS])[home] + rng.normal(0, 0.07, n), 6)
    home_lon = np.round(np.array([r.lon for r in REGIONS])[home] + rng.normal(0, 0.09, n), 6)
    spend = bank_spend[bank] * rng.lognormal(0.0, 0.4, n)
    rate = np.clip(bank_activity[bank] * rng.lognormal(np.log(1.5), 0.5, n), 0.2, 10.0)
    # Daily rhythm: the base profile shifted by a chronotype of -2..+2 hours, with personal noise.
    shift = rng.integers(-2, 3, n)
    hours = _HOUR_PROFILE[(np.arange(24)[None, :] - shift[:, None]) % 24] * rng.gamma(20.0, 1 / 20.0, (n, 24))
    week = _WEEK_PROFILE[None, :] * np.ones((n, 7))
    week[:, 5:] *= rng.lognormal(0.0, 0.25, (n, 1))
    # Favourite merchants from the home metro, Zipf-weighted and tilted by the bank's category mix.
    m = world.per_region
    picks = np.argsort(rng.random((n, m)), axis=1)[:, :_N_FAVOURITES]
    fav = home[:, None] * m + picks
    zipf = 1.0 / np.arange(1, _N_FAVOURITES + 1) ** 1.1
    fav_w = zipf[None, :] * bank_tilt[bank[:, None], world.m_cat[fav]]
    # One trip per cardholder at most, to another metro.
    trip = rng.random(n) < 1 - np.exp(-config.days / 120)
    trip_days = rng.integers(2, 7, n)
    trip_start = (rng.random(n) * np.maximum(config.days - trip_days, 1)).astype(np.int64)
    other = (home + rng.integers(1, n_regions, n)) % n_regions
    trip_region = np.where(trip & (config.days > 2), other, -1)
    card = (np.arange(n, dtype=np.int64) * 982_451_653 + int(rng.integers(0, 10**12))) % 10**14
    return _People(
        bank=bank, home=home, home_lat=home_lat, home_lon=home_lon, spend=spend, rate=rate,
        hour_cdf=_cdf(hours), week=week, fav=fav, fav_cdf=_cdf(fav_w), trip_region=trip_region,
        trip_start=trip_start, trip_days=trip_days,
        card=np.array([_with_check_digit(f"4{c:014d}") for c in card], dtype=object),
    )  # fmt: skip


# --------------------------------------------------------------------------- transactions


@dataclass
class _Tx:
    """Column arrays of generated transactions (times are POSIX seconds, UTC)."""

    holder: np.ndarray
    merchant: np.ndarray
    utc: np.ndarray
    amount: np.ndarray
    scenario: np.ndarray

    @staticmethod
    def concat(parts: list[_Tx]) -> _Tx:
        return _Tx(*(np.concatenate([getattr(p, f) for p in parts]) for f in
                     ("holder", "merchant", "utc", "amount", "scenario")))


def _start_epoch(config: GeneratorConfig) -> int:
    return int(pd.Timestamp(config.start, tz="UTC").timestamp())


def _amounts(world: _World, people: _People, holder: np.ndarray, merchant: np.ndarray,
             rng: np.random.Generator, scale: np.ndarray | float = 1.0) -> np.ndarray:
    cat = world.m_cat[merchant]
    raw = np.exp(_LOG_MEDIAN[cat] + _SIGMA[cat] * rng.standard_normal(len(cat)))
    return np.maximum(np.round(raw * people.spend[holder] * world.m_price[merchant] * scale, 2), 1.0)


def _legit(config: GeneratorConfig, world: _World, people: _People, rng: np.random.Generator) -> _Tx:
    n, days = config.cardholders, config.days
    start = pd.Timestamp(config.start, tz="UTC")
    dow = (start.dayofweek + np.arange(days)) % 7
    lam = people.rate[:, None] * people.week[:, dow] / float(_SESSION_SIZES @ _SESSION_P)
    n_sess = rng.poisson(lam).ravel()
    cell = np.repeat(np.arange(n * days), n_sess)
    holder_s, day_s = cell // days, cell % days
    size = rng.choice(_SESSION_SIZES, size=cell.size, p=_SESSION_P)
    hour = _sample_rows(people.hour_cdf, holder_s, rng.random(cell.size))
    local_s = day_s * _DAY + hour * 3600 + rng.integers(0, 3600, cell.size)
    # Expand sessions to transactions: minutes apart within a session.
    sess = np.repeat(np.arange(cell.size), size)
    first = np.r_[0, np.cumsum(size)[:-1]]
    gap = rng.exponential(16 * 60.0, sess.size) + 120.0
    gap[np.arange(sess.size) == first[sess]] = 0.0
    csum = np.cumsum(gap)
    local = local_s[sess] + (csum - csum[first[sess]]).astype(np.int64)
    holder, day = holder_s[sess], day_s[sess]
    # Travel: during the trip, most purchases are at merchants of the visited metro, in its time zone.
    trip = people.trip_region[holder]
    trip_start = people.trip_start[holder]
    in_trip = (trip >= 0) & (day >= trip_start) & (day < trip_start + people.trip_days[holder])
    region = np.where(in_trip, trip, people.home[holder])
    offset = np.array([r.utc_offset for r in REGIONS])[region]
    utc = _start_epoch(config) + local - offset * 3600
    fav = people.fav[holder, _sample_rows(people.fav_cdf, holder, rng.random(sess.size))]
    random_local = region * world.per_region + rng.integers(0, world.per_region, sess.size)
    wander = (rng.random(sess.size) < _P_EXPLORE) | (in_trip & (rng.random(sess.size) < _P_TRAVEL_LOCAL))
    merchant = np.where(wander, random_local, fav)
    scenario = np.where(in_trip, _SCENARIO_NAMES.index(_TRAVEL), _SCENARIO_NAMES.index(_LEGIT))
    return _Tx(holder, merchant, utc.astype(np.int64), _amounts(world, people, holder, merchant, rng), scenario)


def _burst_sizes(total: int, lo: int, hi: int, rng: np.random.Generator) -> np.ndarray:
    """Split ``total`` fraudulent transactions into incidents of roughly ``lo..hi`` each, exactly."""
    if total <= 0:
        return np.zeros(0, dtype=np.int64)
    k = max(1, min(round(total / ((lo + hi) / 2)), total // lo))
    base = lo if total >= k * lo else 1
    return base + rng.multinomial(total - k * base, np.full(k, 1.0 / k))


def _burst_times(sizes: np.ndarray, t0: np.ndarray, gap_lo: float, gap_hi: float,
                 rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(incident index, time) of every transaction: a burst starting at ``t0`` with uniform gaps."""
    inc = np.repeat(np.arange(sizes.size), sizes)
    first = np.r_[0, np.cumsum(sizes)[:-1]]
    gap = rng.uniform(gap_lo, gap_hi, inc.size)
    gap[np.arange(inc.size) == first[inc]] = 0.0
    csum = np.cumsum(gap)
    return inc, (t0[inc] + csum - csum[first[inc]]).astype(np.int64)


def _new_merchants(pool: np.ndarray, holder: np.ndarray, people: _People, rng: np.random.Generator) -> np.ndarray:
    """Random merchants from ``pool`` that are not among each holder's favourites (a few redraws)."""
    pick = pool[rng.integers(0, pool.size, holder.size)]
    for _ in range(4):
        known = (people.fav[holder] == pick[:, None]).any(axis=1)
        if not known.any():
            break
        pick[known] = pool[rng.integers(0, pool.size, int(known.sum()))]
    return pick


def _local_time(day: np.ndarray, hour: np.ndarray, region: np.ndarray, config: GeneratorConfig,
                rng: np.random.Generator) -> np.ndarray:
    offset = np.array([r.utc_offset for r in REGIONS])[region]
    return _start_epoch(config) + day * _DAY + (hour * 3600 + rng.integers(0, 3600, day.size)) - offset * 3600


def _fraud(config: GeneratorConfig, world: _World, people: _People, legit: _Tx,
           rng: np.random.Generator) -> tuple[_Tx, list[str]]:
    n_legit = legit.holder.size
    target = round(config.fraud_rate * n_legit / (1 - config.fraud_rate)) if config.fraud_rate < 1 else 0
    if target == 0 or n_legit == 0:
        return _empty_tx(), []
    counts = np.bincount(legit.holder, minlength=config.cardholders)
    eligible = np.flatnonzero(counts >= 3)
    eligible = eligible if eligible.size else np.flatnonzero(counts > 0)
    victims = rng.permutation(eligible)
    used = 0

    def take(k: int) -> np.ndarray:
        nonlocal used
        idx = (used + np.arange(k)) % victims.size
        used += k
        return victims[idx]

    names = list(FRAUD_SCENARIOS)
    share = np.array([FRAUD_SCENARIOS[s] for s in names])
    per = np.floor(share * target).astype(int)
    per[np.argsort(-(share * target - per))[: target - per.sum()]] += 1
    n_s = dict(zip(names, per.tolist(), strict=True))
    warmup = min(7, config.days // 4)
    last_day = max(config.days - 1, warmup + 1)
    online = np.flatnonzero(_ONLINE[world.m_cat])
    parts: list[_Tx] = []

    def add(holder: np.ndarray, merchant: np.ndarray, utc: np.ndarray, amount: np.ndarray, name: str) -> None:
        parts.append(_Tx(holder, merchant, utc, amount, np.full(holder.size, _SCENARIO_NAMES.index(name))))

    # Card testing: bursts of tiny charges at online merchants anywhere, seconds to minutes apart.
    sizes = _burst_sizes(n_s["card_testing"], 3, 8, rng)
    if sizes.size:
        holder_i = take(sizes.size)
        day = rng.integers(warmup, last_day, sizes.size)
        t0 = _local_time(day, rng.integers(0, 24, sizes.size), people.home[holder_i], config, rng)
        inc, utc = _burst_times(sizes, t0, 5, 90, rng)
        tester = online[rng.integers(0, online.size, sizes.size)]
        same = rng.random(inc.size) < 0.6  # testers often hammer one merchant, sometimes spread out
        merchant = np.where(same, tester[inc], online[rng.integers(0, online.size, inc.size)])
        add(holder_i[inc], merchant, utc, np.round(rng.uniform(0.5, 3.0, inc.size), 2), "card_testing")

    # Account takeover: far metro, odd local hours of the victim's home, new merchants, high amounts.
    sizes = _burst_sizes(n_s["account_takeover"], 3, 7, rng)
    if sizes.size:
        holder_i = take(sizes.size)
        far = np.argsort(-world.region_dist[people.home[holder_i]], axis=1)[:, :3]
        dest = far[np.arange(sizes.size), rng.integers(0, 3, sizes.size)]
        day = rng.integers(warmup, last_day, sizes.size)
        t0 = _local_time(day, rng.integers(1, 5, sizes.size), people.home[holder_i], config, rng)
        inc, utc = _burst_times(sizes, t0, 180, 2400, rng)
        cats = [_CAT_INDEX[c] for c in ("shopping_pos", "shopping_net", "misc_pos", "travel", "entertainment")]
        merchant = np.empty(inc.size, dtype=np.int64)
        for r in np.unique(dest[inc]):
            rows = np.flatnonzero(dest[inc] == r)
            merchant[rows] = _new_merchants(world.in_region(int(r), cats), holder_i[inc][rows], people, rng)
        amount = _amounts(world, people, holder_i[inc], merchant, rng, rng.uniform(4, 10, inc.size))
        add(holder_i[inc], merchant, utc, np.maximum(amount, 50.0), "account_takeover")

    # Lost/stolen card: burst near home at new physical merchants within ~2 hours, high amounts.
    sizes = _burst_sizes(n_s["lost_stolen"], 4, 9, rng)
    if sizes.size:
        holder_i = take(sizes.size)
        day = rng.integers(warmup, last_day, sizes.size)
        t0 = _local_time(day, rng.integers(9, 21, sizes.size), people.home[holder_i], config, rng)
        inc, utc = _burst_times(sizes, t0, 180, 1200, rng)
        cats = [_CAT_INDEX[c] for c in ("shopping_pos", "misc_pos", "gas_transport", "grocery_pos", "home")]
        region = people.home[holder_i][inc]
        merchant = np.empty(inc.size, dtype=np.int64)
        for r in np.unique(region):
            rows = np.flatnonzero(region == r)
            merchant[rows] = _new_merchants(world.in_region(int(r), cats), holder_i[inc][rows], people, rng)
        amount = _amounts(world, people, holder_i[inc], merchant, rng, rng.uniform(3, 8, inc.size))
        add(holder_i[inc], merchant, utc, np.maximum(amount, 30.0), "lost_stolen")

    # Compromised merchant: customers of a breached merchant get charged elsewhere days later.
    breached: list[str] = []
    sizes = _burst_sizes(n_s["compromised_merchant"], 1, 3, rng)
    if sizes.size:
        start = _start_epoch(config)
        end = start + config.days * _DAY
        window_lo, window_hi = start + warmup * _DAY, start + max(int(config.days * 0.6), warmup + 1) * _DAY
        physical = ~_ONLINE[world.m_cat[legit.merchant]] & (legit.utc >= window_lo) & (legit.utc < window_hi)
        popular = np.bincount(legit.merchant[physical], minlength=world.m_id.size)
        order = rng.permutation(np.flatnonzero(popular))
        order = order[np.argsort(-popular[order], kind="stable")]
        exposures_h, exposures_t = [], []
        need = sizes.size
        for mid in order:
            rows = np.flatnonzero(physical & (legit.merchant == mid))
            holders, first_idx = np.unique(legit.holder[rows], return_index=True)
            pick = rng.permutation(holders.size)[: max(1, int(0.4 * holders.size))]
            exposures_h.append(holders[pick])
            exposures_t.append(legit.utc[rows][first_idx][pick])
            breached.append(str(world.m_id[mid]))
            need -= pick.size
            if need <= 0:
                break
        if exposures_h:
            ex_h = np.concatenate(exposures_h)[: sizes.size]
            ex_t = np.concatenate(exposures_t)[: sizes.size]
            sizes = sizes[: ex_h.size]
            room = np.maximum(end - ex_t - 3600, _DAY)
            t0 = ex_t + np.minimum(rng.uniform(2 * _DAY, 15 * _DAY, ex_h.size), room - 3600).astype(np.int64)
            inc, utc = _burst_times(sizes, t0, 600, 6 * 3600, rng)
            utc = np.minimum(utc, end - 1)
            far = np.argsort(-world.region_dist[people.home[ex_h]], axis=1)[:, 0]
            use_online = rng.random(inc.size) < 0.5
            far_pool = far[inc] * world.per_region + rng.integers(0, world.per_region, inc.size)
            merchant = np.where(use_online, online[rng.integers(0, online.size, inc.size)], far_pool)
            amount = _amounts(world, people, ex_h[inc], merchant, rng, rng.uniform(2, 5, inc.size))
            add(ex_h[inc], merchant, utc, amount, "compromised_merchant")
    return (_Tx.concat(parts) if parts else _empty_tx()), breached


def _empty_tx() -> _Tx:
    z = np.zeros(0, dtype=np.int64)
    return _Tx(z, z, z, np.zeros(0), z)


def generate_frame(config: GeneratorConfig) -> tuple[pd.DataFrame, dict[str, object]]:
    """Generate the full transaction frame in memory (canonical columns + ``bank``, ``scenario``, ``holder``).

    Rows are sorted by (timestamp, cardholder). The second value carries
    generator facts for the manifest (e.g. which merchants were breached).
    """
    root = np.random.SeedSequence(config.seed)
    world_seed, people_seed, legit_seed, fraud_seed, id_seed, persona_seed = root.spawn(6)
    world = _build_world(config, np.random.default_rng(world_seed))
    people = _build_people(config, world, np.random.default_rng(people_seed))
    legit = _legit(config, world, people, np.random.default_rng(legit_seed))
    fraud, breached = _fraud(config, world, people, legit, np.random.default_rng(fraud_seed))
    tx = _Tx.concat([legit, fraud])
    order = np.lexsort((tx.merchant, tx.holder, tx.utc))
    tx = _Tx(*(getattr(tx, f)[order] for f in ("holder", "merchant", "utc", "amount", "scenario")))
    hexes = np.random.default_rng(id_seed).bytes(16 * tx.holder.size).hex()
    scenario = np.array(_SCENARIO_NAMES, dtype=object)[tx.scenario]
    frame = pd.DataFrame(
        {
            "transaction_id": [hexes[i : i + 32] for i in range(0, 32 * tx.holder.size, 32)],
            "cardholder_id": people.card[tx.holder],
            "merchant_id": world.m_id[tx.merchant],
            "timestamp": pd.to_datetime(tx.utc, unit="s", utc=True).astype("datetime64[us, UTC]"),
            "amount": tx.amount,
            "lat": world.m_lat[tx.merchant],
            "lon": world.m_lon[tx.merchant],
            "mcc": np.array([c.name for c in CATEGORIES], dtype=object)[world.m_cat[tx.merchant]],
            "is_fraud": ~np.isin(scenario, [_LEGIT, _TRAVEL]),
            "geo_source": GEO_EXACT,
            "bank": people.bank[tx.holder],
            "scenario": scenario,
            "holder": tx.holder,
        }
    )
    facts: dict[str, object] = {"breached_merchants": breached, "_people": people, "_persona_seed": persona_seed}
    return frame, facts


# --------------------------------------------------------------------------- raw Sparkov CSV

_FIRST_F = ("Mary", "Jennifer", "Linda", "Susan", "Karen", "Lisa", "Nancy", "Sandra", "Ashley", "Emily", "Donna",
            "Michelle", "Amanda", "Melissa", "Laura", "Rebecca", "Sharon", "Cynthia", "Kathleen", "Amy")
_FIRST_M = ("James", "John", "Robert", "Michael", "William", "David", "Richard", "Joseph", "Thomas", "Daniel",
            "Matthew", "Anthony", "Mark", "Steven", "Paul", "Andrew", "Joshua", "Kevin", "Brian", "Jason")
_STREETS = ("Main", "Oak", "Pine", "Maple", "Cedar", "Elm", "Washington", "Lake", "Hill", "Park", "Sunset",
            "Ridge", "River", "Church", "Spring")
_STREET_TYPES = ("St", "Ave", "Rd", "Blvd", "Ln", "Dr", "Ct")
_JOBS = ("Teacher", "Nurse", "Engineer, civil", "Accountant", "Software engineer", "Sales executive", "Chef",
         "Pharmacist", "Electrician", "Designer", "Lawyer", "Police officer", "Architect", "Librarian",
         "Psychologist, counselling", "Retail manager", "Dentist", "Journalist", "Plumber", "Data scientist")


def _persona(people: _People, seed: np.random.SeedSequence) -> pd.DataFrame:
    """Fake, seeded identity columns of the Sparkov layout, one row per cardholder."""
    rng = np.random.default_rng(seed)
    n = people.card.size
    female = rng.random(n) < 0.5
    first = np.where(female, np.array(_FIRST_F)[rng.integers(0, len(_FIRST_F), n)],
                     np.array(_FIRST_M)[rng.integers(0, len(_FIRST_M), n)])
    region = [REGIONS[h] for h in people.home]
    birth_year = rng.integers(1945, 2004, n)
    age_group = np.where(birth_year > 2000, "young_adults", np.where(birth_year > 1975, "adults_2550", "adults_50up"))
    gender = np.where(female, "female", "male")
    return pd.DataFrame(
        {
            "ssn": [f"{a:03d}-{b:02d}-{c:04d}" for a, b, c in zip(rng.integers(100, 900, n), rng.integers(10, 100, n),
                                                                   rng.integers(1000, 10000, n), strict=True)],
            "cc_num": people.card,
            "first": first,
            "last": np.array(_SURNAMES)[rng.integers(0, len(_SURNAMES), n)],
            "gender": np.where(female, "F", "M"),
            "street": [f"{k} {_STREETS[s]} {_STREET_TYPES[t]}" for k, s, t in zip(
                rng.integers(1, 9999, n), rng.integers(0, len(_STREETS), n), rng.integers(0, len(_STREET_TYPES), n),
                strict=True)],
            "city": [r.city for r in region],
            "state": [r.state for r in region],
            "zip": [f"{r.zip3}{z:02d}" for r, z in zip(region, rng.integers(1, 100, n), strict=True)],
            "lat": people.home_lat,
            "long": people.home_lon,
            "city_pop": [r.population for r in region],
            "job": np.array(_JOBS)[rng.integers(0, len(_JOBS), n)],
            "dob": [f"{y}-{mo:02d}-{d:02d}" for y, mo, d in zip(birth_year, rng.integers(1, 13, n),
                                                                rng.integers(1, 29, n), strict=True)],
            "acct_num": [f"{a:012d}" for a in rng.integers(10**11, 10**12, n)],
            "profile": [f"{a}_{g}_urban.json" for a, g in zip(age_group, gender, strict=True)],
        }
    )


def _sparkov_rows(frame: pd.DataFrame, persona: pd.DataFrame) -> pd.DataFrame:
    """Canonical rows (+ ``holder``) → the Sparkov pipe-layout columns."""
    stamp = np.datetime_as_string(frame["timestamp"].to_numpy(dtype="datetime64[s]"), unit="s")
    stamp = pd.Series(stamp, index=frame.index)
    people = persona.iloc[frame["holder"].to_numpy()].reset_index(drop=True)
    people.index = frame.index
    return people.assign(
        trans_num=frame["transaction_id"],
        trans_date=stamp.str.slice(0, 10),
        trans_time=stamp.str.slice(11, 19),
        unix_time=frame["timestamp"].to_numpy(dtype="datetime64[s]").astype(np.int64),
        category=frame["mcc"],
        amt=frame["amount"],
        is_fraud=frame["is_fraud"].astype(np.int8),
        merchant=frame["merchant_id"],
        merch_lat=frame["lat"],
        merch_long=frame["lon"],
    )


# --------------------------------------------------------------------------- the public entry point


def _write_demographics(writer: DatasetWriter, frame: pd.DataFrame, persona: pd.DataFrame, holders: list[int]
                        ) -> None:
    """Each ``holders`` bank's ``cardholders.parquet``: its cardholders' persona columns, as ``ingest`` keeps them."""
    if not holders:
        return
    bank_of = frame.drop_duplicates("cardholder_id").set_index("cardholder_id")["bank"]
    rows = demographics_of(persona, persona["cc_num"].astype(str))
    banks = rows["cardholder_id"].map(bank_of.rename(index=str))
    for k in holders:
        writer.write_cardholders(k, rows[banks == k])


def generate_dataset(out: Path, config: GeneratorConfig, raw_csv: bool = True, progress: bool = True,
                     banks_layout: BanksConfig | None = None) -> GenerateReport:
    """Generate a multi-bank dataset under ``out`` (layout of :mod:`fedfraud.feature_store.layout`).

    Writes ``bank_<k>/transactions.parquet`` (canonical), ``bank_<k>/labels.parquet``
    (transaction_id, scenario; row-aligned), ``manifest.json``, ``rejects.jsonl``
    and, when ``raw_csv``, the Sparkov pipe-delimited ``raw/transactions.csv``. With ``banks_layout`` (the
    config's ``banks``), a bank holding ``demographics`` also gets ``bank_<k>/cardholders.parquet``, as ``ingest``
    writes it from the same persona columns the raw CSV carries; they are drawn apart from the fraud, so they
    carry no fraud signal here (on Sparkov they do).
    """
    started = time.perf_counter()
    out = Path(out)
    frame, facts = generate_frame(config)
    people, persona_seed = facts.pop("_people"), facts.pop("_persona_seed")
    assert isinstance(people, _People) and isinstance(persona_seed, np.random.SeedSequence)
    logger.info("generate cardholders=%d days=%d transactions=%d seconds=%.2f", config.cardholders, config.days,
                len(frame), time.perf_counter() - started)
    validator = Validator(dedupe=True)
    writer = DatasetWriter(out, config.banks)
    kept = np.zeros(len(frame), dtype=bool)
    canonical = list(CANONICAL_COLUMNS)
    for lo in tqdm(range(0, len(frame), _CHUNK), desc="validate+write", disable=not progress, leave=False):
        part = frame.iloc[lo : lo + _CHUNK]
        result = validator.validate(part[canonical], row_offset=lo)
        ok = np.ones(len(part), dtype=bool)
        ok[result.rejects["row"].to_numpy(dtype=np.int64) - lo] = False
        writer.add(result.accepted, part["bank"].to_numpy()[ok])
        writer.add_rejects(result.rejects)
        kept[lo : lo + len(part)] = ok
    written = frame.loc[kept, ["transaction_id", "scenario", "is_fraud"]]
    scenarios = written.loc[written["is_fraud"], "scenario"].value_counts().to_dict()
    raw_path = out / RAW_CSV if raw_csv else None
    meta = {
        "format": "synthetic",
        "source": "fedfraud generate",
        "partition": "generator",
        "generator": {**config.model_dump(), "regions": [r.code for r in REGIONS],
                      "breached_merchants": facts["breached_merchants"]},
        "scenarios": dict(sorted((str(k), int(v)) for k, v in scenarios.items())),
        "raw_csv": str(RAW_CSV) if raw_csv else None,
    }
    persona = _persona(people, persona_seed) if raw_path is not None or banks_layout is not None else None
    if banks_layout is not None and persona is not None:
        layout = banks_layout.layout(list(range(config.banks)))
        meta["private_features"] = {str(k): list(v) for k, v in layout.items()}
        _write_demographics(writer, frame.loc[kept], persona, [k for k, v in layout.items() if "demographics" in v])
    summary = writer.finish(meta)
    scenario_table = pa.Table.from_pandas(written[["transaction_id", "scenario"]], schema=_LABELS_SCHEMA,
                                          preserve_index=False)
    for k in range(config.banks):
        ids = pq.read_table(bank_dir(out, k) / TRANSACTIONS_FILE, columns=["transaction_id"])
        ids = ids.append_column("_pos", pa.array(np.arange(ids.num_rows)))
        labels = ids.join(scenario_table, "transaction_id", join_type="left outer").sort_by("_pos")
        pq.write_table(labels.select(["transaction_id", "scenario"]).cast(_LABELS_SCHEMA),
                       bank_dir(out, k) / LABELS_FILE, compression="zstd")
    if raw_path is not None and persona is not None:
        raw_path.unlink(missing_ok=True)
        for lo in tqdm(range(0, len(frame), _CHUNK), desc="raw csv", disable=not progress, leave=False):
            rows = _sparkov_rows(frame.iloc[lo : lo + _CHUNK], persona)
            write_sparkov_csv(rows, raw_path, layout="pipe", append=lo > 0)
    seconds = time.perf_counter() - started
    report = GenerateReport(
        out=out,
        transactions=summary.accepted,
        fraud=sum(b.fraud for b in summary.banks),
        per_bank={b.bank: b.rows for b in summary.banks},
        scenarios=meta["scenarios"],  # type: ignore[arg-type]
        rejected=summary.rejected,
        seconds=seconds,
        raw_csv=raw_path,
    )
    logger.info("generate out=%s transactions=%d fraud=%d rejected=%d seconds=%.2f", out, report.transactions,
                report.fraud, report.rejected, seconds)
    return report
