"""FED-SPFD over heterogeneous banks (issue 39).

* the ``banks`` config section: the demo layout, one ``--set`` override changes one bank, bad values one line;
* ingest keeps Sparkov's demographics only for the banks that hold them, and leaves the canonical rows as before;
* the losses on hand-made numbers: alignment (KL to the global statistics), the private KL to N(0, I), the
  reconstruction with sparsity, and the global statistics from summed sufficient statistics;
* a tiny federated run over the loopback grid trains every bank, publishes one bank's model (kind
  ``fraud-spfd``), and the fraud stage serves a micro-batch with it, as the offline rows score.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from fedfraud.core.errors import ConfigError
from fedfraud.training.fraud.spfd.model import EmbeddingSums, alignment_loss, gaussian_kl, reconstruction_loss

# ---------------------------------------------------------------------------------------------- config + ingest


def test_bank_layout_defaults_overrides_and_errors():
    from fedfraud.config import load_config

    cfg = load_config(None, [])
    assert cfg.banks.layout([0, 1, 2, 3, 4, 5]) == {0: (), 1: ("demographics",), 2: ("demographics",),
                                                    3: ("merchant_history",), 4: ("merchant_history",), 5: ()}
    assert len(set(cfg.banks.layout([0, 1, 2, 3, 4]).values())) == 3  # three schemas across five banks
    cfg = load_config(None, ["banks.2.private_features=[merchant_history, demographics]",
                             "banks.9.private_features=[demographics]"])
    assert cfg.banks.private_features(2) == ("merchant_history", "demographics")
    assert cfg.banks.private_features(1) == ("demographics",)  # the other banks keep the demo layout
    assert cfg.banks.private_features(9) == ("demographics",)
    for bad, says in [("banks.x.private_features=[demographics]", "a bank is a number"),
                      ("banks.1.private_features=[salary]", "banks.1.private_features.0"),
                      ("banks.1.columns=[a]", "Extra inputs"),
                      ("banks.1.private_features=[demographics, demographics]", "twice")]:
        with pytest.raises(ConfigError, match=says) as err:
            load_config(None, [bad])
        assert "\n" not in str(err.value)


def _sparkov_frame(n: int) -> pd.DataFrame:
    """A pipe-layout Sparkov frame whose cardholders differ in dob, gender, city_pop and job (one bad dob)."""
    rng = np.random.default_rng(3)
    holder = rng.integers(0, 30, n)
    stamp = pd.Timestamp("2024-01-01", tz="UTC") + pd.to_timedelta(np.sort(rng.integers(0, 20 * 86400, n)), unit="s")
    return pd.DataFrame({
        "cc_num": [f"4{h:015d}" for h in holder], "state": "NY",
        "gender": ["F" if h % 2 else "M" for h in holder], "city_pop": [str(100 * (h + 1)) for h in holder],
        "job": [f"Job {h % 4}" for h in holder],
        "dob": ["not a date" if h == 7 else f"19{50 + h}-03-0{1 + h % 9}" for h in holder],
        "trans_num": [f"{i:032x}" for i in range(n)], "trans_date": stamp.strftime("%Y-%m-%d"),
        "trans_time": stamp.strftime("%H:%M:%S"), "unix_time": (stamp.asi8 // 10**9).astype(str),
        "category": rng.choice(["grocery_pos", "gas_transport"], n), "amt": np.round(rng.uniform(1, 99, n), 2),
        "is_fraud": rng.choice(["0", "1"], n, p=[0.9, 0.1]), "merchant": [f"m{m}" for m in rng.integers(0, 9, n)],
        "merch_lat": np.round(rng.uniform(30, 45, n), 4), "merch_long": np.round(rng.uniform(-120, -75, n), 4),
    })


def test_ingest_keeps_demographics_only_for_the_banks_that_hold_them(tmp_path):
    from fedfraud.feature_store.layout import bank_dir, read_bank, read_cardholders, read_manifest
    from fedfraud.training.data.config import BanksConfig, IngestConfig
    from fedfraud.training.data.ingest import ingest_csv
    from fedfraud.training.data.sparkov import write_sparkov_csv

    frame = _sparkov_frame(400)
    path = write_sparkov_csv(frame, tmp_path / "s.csv", layout="kaggle")
    ingest_csv(path, tmp_path / "het", IngestConfig(banks=5), progress=False, banks_layout=BanksConfig({}))
    ingest_csv(path, tmp_path / "plain", IngestConfig(banks=5), progress=False)
    manifest = read_manifest(tmp_path / "het")
    assert manifest["private_features"] == {"0": [], "1": ["demographics"], "2": ["demographics"],
                                            "3": ["merchant_history"], "4": ["merchant_history"]}
    for k in range(5):
        pd.testing.assert_frame_equal(read_bank(tmp_path / "het", k), read_bank(tmp_path / "plain", k))
        assert read_cardholders(tmp_path / "plain", k) is None  # no layout: the layout before issue 39
        held = read_cardholders(tmp_path / "het", k)
        if k not in (1, 2):
            assert held is None
            continue
        rows = read_bank(tmp_path / "het", k)
        assert set(held["cardholder_id"]) == set(rows["cardholder_id"])  # every cardholder of the bank, only them
        assert list(held.columns) == ["cardholder_id", "birth_day", "gender_f", "city_pop", "job_code"]
        h = held.set_index("cardholder_id")
        for cid in h.index:
            n = int(cid[1:])
            assert h.loc[cid, "gender_f"] == (1.0 if n % 2 else 0.0) and h.loc[cid, "city_pop"] == 100 * (n + 1)
            if n == 7:
                assert math.isnan(h.loc[cid, "birth_day"])  # a bad optional value is NaN, never a reject
            else:
                born = pd.Timestamp(f"19{50 + n}-03-0{1 + n % 9}", tz="UTC")
                assert h.loc[cid, "birth_day"] == (born - pd.Timestamp(0, tz="UTC")).days
        assert "job" not in held and not (bank_dir(tmp_path / "het", k) / "raw").exists()  # the title is hashed
    assert manifest["total_accepted"] == read_manifest(tmp_path / "plain")["total_accepted"] == 400


# ------------------------------------------------------------------------------------------------------- losses

_SQUARE = torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [0.0, -1.0]], dtype=torch.float64)  # mean 0, S = ⅔ I


def test_alignment_loss_is_the_kl_to_the_global_statistics():
    z = _SQUARE + torch.tensor([2.0, 3.0], dtype=torch.float64)
    cov = torch.eye(2, dtype=torch.float64) * 2 / 3
    same = alignment_loss(z, torch.tensor([2.0, 3.0]), cov, eps=1e-12)
    assert float(same) == pytest.approx(0.0, abs=1e-9)
    shifted = alignment_loss(z, torch.tensor([3.0, 3.0]), cov, eps=1e-12)  # ½ dᵀ Σ⁻¹ d = ½ · 1 / ⅔
    assert float(shifted) == pytest.approx(0.75, abs=1e-9)
    wider = alignment_loss(z, torch.tensor([2.0, 3.0]), 2 * cov, eps=1e-12)  # ½ (−2 ln 2 + tr(2I) − 2)
    assert float(wider) == pytest.approx(1 - math.log(2), abs=1e-9)
    z = z.clone().requires_grad_(True)
    alignment_loss(z, torch.tensor([3.0, 3.0]), cov, eps=1e-12).backward()
    assert z.grad is not None and float(z.grad[:, 0].sum()) < 0  # pulls the batch towards the global mean


def test_private_kl_to_the_standard_normal_and_the_reconstruction_with_sparsity():
    unit = _SQUARE * math.sqrt(1.5)  # S = I, mean 0
    assert float(gaussian_kl(unit, eps=1e-12)) == pytest.approx(0.0, abs=1e-9)
    double = _SQUARE * math.sqrt(3.0)  # S = 2I: ½ (4 − 2 − 2 ln 2)
    assert float(gaussian_kl(double, eps=1e-12)) == pytest.approx(1 - math.log(2), abs=1e-9)
    moved = unit + 1.0  # + ½ μᵀμ = 1
    assert float(gaussian_kl(moved, eps=1e-12)) == pytest.approx(1.0, abs=1e-9)
    x, x_hat = torch.tensor([[1.0, 2.0], [0.0, 0.0]]), torch.zeros(2, 2)
    z = torch.tensor([[3.0, 4.0], [0.0, 0.0]])
    assert float(reconstruction_loss(x_hat, x, z, sparsity=0.1)) == pytest.approx((5 + 0) / 2 + 0.1 * 25 / 2)
    assert float(reconstruction_loss(x, x, torch.zeros(2, 2), sparsity=0.1)) == 0.0


def test_global_statistics_from_summed_sufficient_statistics_are_the_pooled_ones():
    rng = np.random.default_rng(0)
    a, b = rng.normal(0, 1, (50, 3)), rng.normal(2, 3, (20, 3))
    mean, cov = (EmbeddingSums.of(a) + EmbeddingSums.of(b)).mean_cov()
    both = np.vstack([a, b])
    np.testing.assert_allclose(mean, both.mean(0), atol=1e-12)
    np.testing.assert_allclose(cov, np.cov(both.T, bias=True), atol=1e-10)


# --------------------------------------------------------------------------------- federated run, publish, serve


@pytest.fixture(scope="module")
def hetero(tmp_path_factory):
    """Three generated banks with three schemas: shared only, + demographics (written here: the generator has
    none), + merchant history; their tables and private columns as ``train fraud --variant fed-spfd`` builds them.
    """
    from fedfraud.config import load_config
    from fedfraud.feature_store.layout import CARDHOLDERS_FILE, bank_dir, list_banks, read_bank
    from fedfraud.training.data.config import GeneratorConfig
    from fedfraud.training.data.synthetic import generate_dataset
    from fedfraud.training.fraud.dataset import bank_features
    from fedfraud.training.fraud.spfd.publish import heterogeneous_tables

    root = tmp_path_factory.mktemp("spfd")
    generate_dataset(root, GeneratorConfig(banks=3, cardholders=90, days=21, fraud_rate=0.05, seed=5), raw_csv=False,
                     progress=False)
    ids = read_bank(root, 1)["cardholder_id"].drop_duplicates().astype(str)
    rng = np.random.default_rng(1)
    pd.DataFrame({"cardholder_id": ids, "birth_day": rng.uniform(-15000, 10000, len(ids)),
                  "gender_f": rng.integers(0, 2, len(ids)).astype(float), "city_pop": rng.uniform(1e2, 1e6, len(ids)),
                  "job_code": rng.integers(0, 65521, len(ids)).astype(float)}).to_parquet(
        bank_dir(root, 1) / CARDHOLDERS_FILE)
    cfg = load_config(None, ["fraud.spfd.rounds=3", "fraud.spfd.warm_rounds=1", "fraud.spfd.engine=loopback",
                             "fraud.spfd.hidden=16", "fraud.threshold_bins=100", "fraud.use_anomaly_score=false",
                             "banks.1.private_features=[demographics]", "banks.2.private_features=[merchant_history]"])
    banks = {b: bank_features(root, b, cfg.fraud, cfg.encoder, cfg.privacy, None) for b in list_banks(root)}
    tables, private = heterogeneous_tables(cfg, banks, root)
    return cfg, root, tables, private, banks


@pytest.fixture(scope="module")
def trained(hetero):
    from fedfraud.training.fraud.spfd.trainer import spfd_job, train_spfd_jobs

    cfg, _, tables, private, _ = hetero
    return train_spfd_jobs(tables, private, cfg.fraud, [spfd_job(v) for v in ("fed-spfd", "fedavg", "fedper")])


def test_tables_hold_each_banks_own_columns(hetero):
    from fedfraud.training.fraud.spfd.columns import held_columns, shared_columns

    _, _, tables, private, _ = hetero
    assert private == {0: (), 1: ("age_years", "gender_f", "city_pop", "job_code"),
                       2: ("merchant_new", "merchant_visits")}
    assert tables[0].names == tables[2].names and tables[1].names == (*tables[0].names, *private[1])
    age = tables[1].X[:, tables[1].names.index("age_years")]
    assert np.isfinite(age).all() and -30 < age.min() and age.max() < 110
    shared = shared_columns(tables[0].names, use_anomaly_score=False)
    assert "merchant_visits" not in shared and "anomaly_score" not in shared and "amount" in shared
    own = held_columns(tables[0], shared, private[0])  # what bank 0 alone may read (its local XGBoost)
    assert own.names == shared and "merchant_visits" not in own.names
    assert held_columns(tables[2], shared, private[2]).names[-2:] == ("merchant_new", "merchant_visits")


def test_tiny_federated_run_trains_every_bank_and_keeps_private_parts_at_home(hetero, trained):
    _, _, tables, private, _ = hetero
    spfd, fedavg, fedper = trained["fed-spfd#0"], trained["fedavg#0"], trained["fedper#0"]
    for b, table in tables.items():
        m = spfd[b]
        assert m.private == private[b] and m.input_names == (*m.shared, *private[b])
        test = table.split == "test"
        X = table.X[:, [table.names.index(n) for n in m.input_names]][test]
        s = m.scores(X)
        assert s.shape == (int(test.sum()),) and np.isfinite(s).all() and 0 <= s.min() <= s.max() <= 1
        assert fedavg[b].private == fedper[b].private == ()  # the baselines read the shared columns only
    # the shared encoder and the classifier are the federation's, the private autoencoder the bank's own
    a, b = spfd[1].arrays, spfd[2].arrays
    for key in a:
        if key.startswith(("encoder.", "classifier.", "shared.")):
            np.testing.assert_array_equal(a[key], b[key])
    assert any(k.startswith("private_encoder.") for k in a) and not any(k.startswith("private_") for k in
                                                                         spfd[0].arrays)
    assert not np.array_equal(fedper[1].arrays["classifier.2.weight"], fedper[2].arrays["classifier.2.weight"])
    history = spfd[1].meta["history"]
    assert len(history) == 3 and all(h["loss-alg"] > 0 and h["loss-pn"] > 0 and h["loss-rec"] > 0 for h in history)
    assert all(h["loss-alg"] == 0 for h in fedavg[1].meta["history"])


def test_serving_decides_with_a_banks_published_fed_spfd_model(hetero, trained, tmp_path):
    """Publish bank 2's model (kind fraud-spfd), load it as a replica with ``fraud.variant: fed-spfd`` does, and
    decide one micro-batch through the fraud stage over a real SQLite KV: the scores are the offline rows', and
    the record has XGBoost's shape (score, decision, three top reasons, both model tags)."""
    from fedfraud.config import load_config
    from fedfraud.feature_store.encoders import timestamps_us
    from fedfraud.feature_store.layout import read_bank
    from fedfraud.feature_store.privacy import PrivateFeaturizer
    from fedfraud.serving.fraud_stage import FraudStage, fraud_config_for, load_fraud_model
    from fedfraud.serving.graph_fraud import for_bank, fraud_kind
    from fedfraud.serving.kvstore import SqliteKV
    from fedfraud.serving.scored import ScoredBatch
    from fedfraud.training.registry import ModelRegistry

    cfg, root, tables, _, _ = hetero
    bank = 2
    version = trained["fed-spfd#0"][bank].publish(ModelRegistry(tmp_path / "reg"),
                                                  config={"fraud": cfg.fraud.model_dump()}, metrics={})
    assert fraud_kind("fed-spfd") == version.kind == "fraud-spfd"
    assert "sum of outer products" in version.model_card and "outer products" in version.privacy["leaves_a_bank"]
    model, tag = load_fraud_model(ModelRegistry(tmp_path / "reg"), "latest", fraud_kind("fed-spfd"))
    assert tag == "fraud-spfd:v1" and model.bank == bank and model.transitions == tables[bank].transitions
    assert model.input_names[-2:] == ("merchant_new", "merchant_visits") and model.used == model.input_names
    assert for_bank((model, tag), bank) == (model, tag)  # what the hot path's loader checks (serving.bank_id)
    with pytest.raises(ValueError, match="bank 2's FED-SPFD model; this replica serves bank 0"):
        for_bank((model, tag), 0)

    full = load_config(None, [])
    frame = read_bank(root, bank)
    featurizer = PrivateFeaturizer.for_bank(full.encoder, full.privacy, bank)
    stage = FraudStage(SqliteKV(tmp_path / "kv.sqlite"), model, tag, fraud_config_for({"fraud": cfg.fraud.model_dump()},
                       None), full.encoder.dim, ring=4, reasons_for="all")
    ts = timestamps_us(frame["timestamp"])
    idx = np.lexsort((frame["transaction_id"].to_numpy(), ts))[:12]  # the bank's first micro-batch
    part = frame.iloc[idx]
    private = featurizer.transform(part)
    scored = ScoredBatch("test", part["transaction_id"].tolist(), list(private.cardholder), ts[idx].tolist(),
                         part["amount"].tolist(), part["mcc"].astype(str).tolist(), private.merchant,
                         private.location, private.time, np.full(len(idx), np.nan), np.zeros(len(idx), bool),
                         np.zeros(len(idx), dtype=np.int64), "anomaly:v1",
                         merchant_hash=featurizer.merchant_hash(part["merchant_id"]))
    decided = stage.decide(scored)
    table = tables[bank]
    offline = model.scores(table.X[:, [table.names.index(n) for n in model.input_names]][idx])
    np.testing.assert_allclose([r["score"] for r in decided.records], offline, rtol=0, atol=1e-5)
    record = decided.records[-1]
    assert record["models"] == {"anomaly": "anomaly:v1", "fraud": "fraud-spfd:v1"}
    assert record["decision"] == ("fraud" if record["score"] >= model.threshold else "legit")
    reasons = record["top_reasons"]
    assert len(reasons) == 3 and all(set(r) == {"feature", "value", "contribution"} for r in reasons)
    assert {r["feature"] for r in reasons} <= set(model.input_names)
    contributions = [r["contribution"] for r in reasons]
    assert contributions == sorted(contributions, reverse=record["decision"] == "fraud")


def test_a_demographics_bank_serves_with_its_cardholders_rows_read_from_feast(hetero, trained, tmp_path):
    """Bank 1 holds demographics: ``features apply`` writes its ``cardholder_demographics`` rows (card token keys),
    materialisation loads them into the online store, the replica's state read returns them, and the fraud stage
    takes the age at each transaction: the scores are the offline table's, which training computed with the same
    function. Without the rows (a repo or stage that does not read them) the stage still decides, on NaN columns.
    """
    from fedfraud.config import load_config
    from fedfraud.feature_store.demographics import DEMOGRAPHIC_FEATURES
    from fedfraud.feature_store.encoders import timestamps_us
    from fedfraud.feature_store.feast_store import apply_repo, materialize_repo, open_store
    from fedfraud.feature_store.layout import read_bank
    from fedfraud.feature_store.offline import write_offline
    from fedfraud.feature_store.online import OnlineStateClient
    from fedfraud.feature_store.privacy import PrivateFeaturizer
    from fedfraud.serving.fraud_stage import FraudStage, fraud_config_for, reads_demographics
    from fedfraud.serving.kvstore import SqliteKV
    from fedfraud.serving.scored import ScoredBatch

    cfg, root, tables, _, _ = hetero
    bank, model = 1, trained["fed-spfd#0"][1]
    assert reads_demographics(model) and not reads_demographics(trained["fed-spfd#0"][2])
    full = load_config(None, [])
    features = full.features.model_copy(update={"project": "fedfraud_spfd_demographics"})
    repo = tmp_path / "repo"
    write_offline(root, repo, full.encoder, full.privacy, full.egograph, features.location_cell_deg, banks=[0, bank],
                  progress=False)
    store = open_store(features, repo, "sqlite")
    apply_repo(store)
    materialize_repo(store)
    client = OnlineStateClient(store, full.egograph, features.location_cell_deg)

    frame = read_bank(root, bank)
    featurizer = PrivateFeaturizer.for_bank(full.encoder, full.privacy, bank)
    ts = timestamps_us(frame["timestamp"])
    idx = np.lexsort((frame["transaction_id"].to_numpy(), ts))[:16]
    part = frame.iloc[idx]
    private = featurizer.transform(part)
    holders = list(private.cardholder)
    states, _ = client.read_batch(list(dict.fromkeys(holders)), bank, demographics=True)
    rows = {s.cardholder: s.demographics for s in states}
    assert all(r is not None and set(r) >= {"birth_day", "gender_f", "city_pop", "job_code"} for r in rows.values())
    stage = FraudStage(SqliteKV(tmp_path / "kv.sqlite"), model, "fraud-spfd:v1",
                       fraud_config_for({"fraud": cfg.fraud.model_dump()}, None), full.encoder.dim, ring=4)

    def batch(demographics: list | None) -> ScoredBatch:
        return ScoredBatch("test", part["transaction_id"].tolist(), holders, ts[idx].tolist(), part["amount"].tolist(),
                           part["mcc"].astype(str).tolist(), private.merchant, private.location, private.time,
                           np.full(len(idx), np.nan), np.zeros(len(idx), bool), np.zeros(len(idx), dtype=np.int64),
                           "anomaly:v1", merchant_hash=featurizer.merchant_hash(part["merchant_id"]),
                           demographics=demographics)

    decided = stage.decide(batch([rows[h] for h in holders]))
    table = tables[bank]
    offline = model.scores(table.X[:, [table.names.index(n) for n in model.input_names]][idx])
    np.testing.assert_allclose([r["score"] for r in decided.records], offline, rtol=0, atol=1e-5)
    assert set(DEMOGRAPHIC_FEATURES) <= set(model.input_names)
    other = FraudStage(SqliteKV(tmp_path / "kv2.sqlite"), model, "fraud-spfd:v1",
                       fraud_config_for({"fraud": cfg.fraud.model_dump()}, None), full.encoder.dim, ring=4)
    assert all(r["decision"] in ("fraud", "legit") for r in other.decide(batch(None)).records)


def test_train_and_publish_records_pooled_and_serving_bank_metrics(hetero, tmp_path):
    """What ``train fraud --variant fed-spfd --bank 2`` runs once the banks' rows are loaded."""
    from fedfraud.training.fraud.spfd.publish import train_and_publish_spfd

    cfg, root, _, _, banks = hetero
    version, metrics = train_and_publish_spfd(cfg, banks, {"root": root, "anomaly_model": None, "data": str(root)},
                                              tmp_path / "reg", bank=2)
    assert version.tag == "fraud-spfd:v1" and version.extra["bank"] == 2
    assert version.config["bank_layout"] == {"0": [], "1": ["demographics"], "2": ["merchant_history"]}
    assert 0 <= metrics["test_pr_auc"] <= 1 and 0 <= metrics["bank2_pr_auc"] <= 1 and metrics["test_frauds"] > 0


def test_eval_heterogeneous_compares_every_variant_through_the_cli(hetero, tmp_path, capsys):
    """The comparison on the tiny banks (numbers meaningless at this size): every variant, pooled and per bank;
    a layout the data cannot give is one line of error."""
    from fedfraud.cli.app import main
    from fedfraud.training.fraud.spfd.study import LABELS

    _, root, _, _, _ = hetero
    common = ["--set", "fraud.spfd.rounds=2", "--set", "fraud.spfd.warm_rounds=1", "--set", "fraud.spfd.hidden=16",
              "--set", "fraud.threshold_bins=100", "--set", "fraud.merchant_risk_features=false",
              "--set", "fraud.num_boost_round=10", "--set", "banks.1.private_features=[demographics]"]
    run = ["eval", "heterogeneous", "--data", str(root), "--seeds", "1", "--reps", "50"]
    assert main([*common, "--set", "banks.2.private_features=[demographics]", *run]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert any("bank 2 holds demographics" in line for line in err)
    assert main([*common, "--set", "banks.2.private_features=[merchant_history]", *run, "--no-tune",
                 "--out", str(tmp_path / "h.md")]) == 0
    text = (tmp_path / "h.md").read_text()
    for variant in ("federated XGBoost (shared)", "local XGBoost (all columns)", *LABELS.values()):
        assert f"| {variant} | " in text
    assert "| 2 | merchant_new, merchant_visits |" in text and "| 0 | — |" in text
    assert "FED-SPFD − FedPer" in text and "FED-SPFD − local XGBoost (all columns)" in text


def test_unknown_variant_is_refused():
    from fedfraud.training.fraud.spfd.trainer import spfd_job

    with pytest.raises(ValueError, match="unknown FED-SPFD variant"):
        spfd_job("pfedme")
    with pytest.raises(ValueError, match="unknown spfd settings"):
        spfd_job("fed-spfd", overrides=[("lambda_nope", 1.0)])


def test_batch_scoring_with_a_demographics_banks_model_scores_its_rows_as_training(hetero, trained, tmp_path):
    """``fedfraud score`` with ``fraud.variant: fed-spfd`` (kind ``fraud-spfd``): the model's own bank only, its
    demographic columns joined from ``cardholders.parquet`` with the age at each transaction, the columns picked by
    name: the scores are the training table's rows'.
    """
    import torch

    from fedfraud.config import load_config
    from fedfraud.core.errors import UserError
    from fedfraud.training.anomaly.config import AnomalyConfig
    from fedfraud.training.anomaly.model import AnomalyModel
    from fedfraud.training.anomaly.scorer import publish_anomaly_model
    from fedfraud.serving.batch import score_path
    from fedfraud.training.registry import ModelRegistry

    cfg, root, tables, _, _ = hetero
    full = load_config(None, [])
    reg = ModelRegistry(tmp_path / "reg")
    torch.manual_seed(0)
    acfg = AnomalyConfig()
    publish_anomaly_model(reg, AnomalyModel(acfg, full.encoder, full.egograph.max_nodes).state_dict(),
                          anomaly_cfg=acfg, encoder_cfg=full.encoder, ego_cfg=full.egograph, config={}, metrics={},
                          privacy={}, card="test")  # read by batch scoring; this model does not use its score
    model = trained["fed-spfd#0"][1]
    model.publish(reg, config={"fraud": cfg.fraud.model_dump()}, metrics={})
    out = tmp_path / "scored.parquet"
    report = score_path(root, reg.root, out, progress=False, fraud_kind="fraud-spfd")
    scored = pd.read_parquet(out)
    assert set(scored["bank"]) == {1} and report.models["fraud"] == "fraud-spfd:v1"
    table = tables[1]
    offline = model.scores(table.X[:, [table.names.index(n) for n in model.input_names]])
    got = scored.set_index("transaction_id").loc[table.transaction_id.astype(str), "fraud_score"].to_numpy()
    np.testing.assert_allclose(got, offline, rtol=0, atol=1e-5)
    with pytest.raises(UserError, match="is bank 1's model: score this CSV with --bank 1"):
        score_path(root / "bank_1" / "transactions.parquet", reg.root, tmp_path / "x.csv", progress=False,
                   fraud_kind="fraud-spfd")  # a CSV is scored as --bank 0's data by default


# ---------------------------------------------------------------------------------------- aggregation: dsfl

#: Laplace scales 1e-6 on the selected tenth of the coordinates and 2.0 on the others (tests/unit/dsfl_wire.py).
DSFL = {"l1_clip": 1e-2, "epsilon_top": 1e4, "epsilon_rest": 5e-3, "epsilon_select": 0.1, "top_fraction": 0.1,
        "seed": 17}


def test_dsfl_spfd_banks_send_clipped_noised_updates_the_server_weighs_them_and_the_card_states_epsilon(
        hetero, tmp_path):
    """FED-SPFD under ``aggregation: dsfl``: every warm-start and training report on the wire is the bank's
    L1-clipped update plus Laplace noise of the configured scale per dimension; the server moves the model by the
    contribution weights; the embedding statistics still flow; the card's ε is the accountant's for all rounds."""
    from fedfraud.training.federated.config import DSFLConfig
    from fedfraud.training.federated.dsfl_mod import DSFL_KEY, ROUND_OFFSET_KEY
    from fedfraud.training.fraud.spfd.artifact import SpfdFraudModel
    from fedfraud.training.fraud.spfd.config import SpfdConfig
    from fedfraud.training.fraud.spfd.task import SCALER_ARRAYS
    from fedfraud.training.fraud.spfd.trainer import spfd_job, train_spfd_jobs
    from fedfraud.training.registry import ModelRegistry
    from tests.unit.dsfl_wire import (
        assert_dp_off,
        assert_dsfl_card,
        assert_laplace_reports,
        assert_released,
        recorded_train_messages,
    )

    cfg, _, tables, private, _ = hetero
    spfd = SpfdConfig.model_validate({**cfg.fraud.spfd.model_dump(), "aggregation": "dsfl", "dsfl": DSFL})
    fc = cfg.fraud.model_copy(update={"spfd": spfd})
    with recorded_train_messages() as pairs:
        models = train_spfd_jobs(tables, private, fc, [spfd_job("fed-spfd")])["fed-spfd#0"]
    banks, rounds = len(tables), spfd.warm_rounds + spfd.rounds
    assert len(pairs) == banks * rounds
    dsfl = spfd.dsfl
    assert all(DSFLConfig.model_validate_json(str(m.content["config"][DSFL_KEY])) == dsfl for m, _ in pairs)
    n = assert_laplace_reports(pairs, dsfl, SCALER_ARRAYS)
    seeds = {(m.metadata.dst_node_id, int(m.content["config"]["server-round"])
              + int(m.content["config"].get(ROUND_OFFSET_KEY, 0))) for m, _ in pairs}
    assert len(seeds) == len(pairs)  # the warm rounds offset the training rounds' noise seed: no draw reused
    train = sorted((p for p in pairs if p[0].content["config"]["phase"] == "train"),
                   key=lambda p: (int(p[0].content["config"]["server-round"]), p[0].metadata.dst_node_id))
    weights = assert_released(train[:banks], train[banks][0])
    np.testing.assert_allclose(models[0].meta["history"][0]["dsfl_weights"], weights)
    assert all("stats" in m.content for m, _ in train)  # the embedding statistics flow as before
    version = models[2].publish(ModelRegistry(tmp_path / "reg"), config={}, metrics={})
    assert_dsfl_card(version, dsfl, rounds, banks, n, "outer products", "shared.mean")
    m = models[2]
    plain = SpfdFraudModel(m.arrays, m.shared, m.private, cfg.fraud.spfd, m.threshold, m.variant, m.bank)
    assert_dp_off(plain.publish(ModelRegistry(tmp_path / "off"), config={}, metrics={}))


def test_dsfl_public_slice_is_refused_for_the_fraud_variants():
    from fedfraud.config import load_config

    for section in ("gnn", "spfd"):
        with pytest.raises(ConfigError, match="public slice"):
            load_config(None, [f"fraud.{section}.aggregation=dsfl", f"fraud.{section}.dsfl.public_cardholders=8"])
