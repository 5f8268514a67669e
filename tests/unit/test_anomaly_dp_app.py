"""apps/anomaly_dp: DP-FedSGD under SecAgg+ as a deployable Flower App (settings, refusals, a whole run).

The whole run goes through the app's real ServerApp function and ClientApp over the loopback grid (every message
serialized as over the SuperLink, every reply the server received written by the audit grid): the banks read their
own folders, every round's gradient crosses only as SecAgg+'s masked vector, each block is evaluated on the banks'
validation cardholders, and the best block is published with (ε, δ) per cardholder on its card.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Context, RecordDict
from flwr.common import MessageType

from fedfraud.core.errors import ConfigError
from fedfraud.feature_store.layout import bank_dir
from fedfraud.training.anomaly.dpsgd import CardholderPool
from fedfraud.training.anomaly.engine import sources_of
from fedfraud.training.anomaly.federated import dp_app
from fedfraud.training.anomaly.federated.task import RunSettings, bank_data, on_node
from fedfraud.training.data.config import GeneratorConfig
from fedfraud.training.data.synthetic import generate_dataset
from fedfraud.training.federated import secagg_prg
from fedfraud.training.federated.dp_fedsgd import REFUSAL
from fedfraud.training.federated.ledger import BUDGET_KEY, LEDGER_KEY, PrivacyLedger
from fedfraud.training.fraud.gnn.loopback import LoopbackGrid
from fedfraud.training.merchant_risk.release_app import AuditGrid, read_audit
from fedfraud.training.registry import ModelRegistry
from tests.integration.tiny_run import TINY_RUN
from tests.unit.test_distributed_dp import task_identity  # noqa: F401 - fixture
from tests.unit.test_merchant_release import _Loopback, masked_vectors

ROOT = Path(__file__).resolve().parents[2]
#: apps/anomaly_dp's values that differ from RunSettings' defaults (the mode, and what the bench chose on validation)
APP_CHOICES = {"num-banks": 3, "rounds": 5, "local-epochs": 4, "lr": 0.03, "cardholder-dp-enabled": True,
               "cardholder-dp-noise": "distributed", "cardholder-dp-sampling-rate": 0.15,
               "cardholder-dp-pairs-per-step": 8}
BANKS = (0, 1, 2)
NODES = {9101: 0, 9102: 1, 9103: 2}  # node id -> partition


def _app_config() -> dict:
    return tomllib.loads((ROOT / "apps" / "anomaly_dp" / "pyproject.toml").read_text())["tool"]["flwr"]["app"]


def test_app_config_is_the_run_settings_defaults_but_the_dp_mode_and_the_benchs_choices():
    app = _app_config()
    assert app["components"] == {"serverapp": "fedfraud.training.anomaly.federated.dp_app:server",
                                 "clientapp": "fedfraud.training.anomaly.federated.dp_app:client"}
    defaults = {**RunSettings.defaults(), **dp_app.APP_DEFAULTS, **APP_CHOICES}
    for key, value in app["config"].items():
        assert key in defaults, key
        assert value == defaults[key], key
    run = dp_app.dp_run({**app["config"], "dp-cardholders": 600})
    assert run.steps == 160 and run.per_block == 32 and run.cardholders == 600


@pytest.mark.parametrize(("change", "message"), [
    ({"dp-cardholders": 0}, "dp-cardholders must be"),
    ({"num-banks": 2}, "at least 3 for SecAgg"),
    ({"cardholder-dp-noise": "local"}, "runs cardholder-dp-enabled = true with"),
    ({"cardholder-dp-enabled": False}, "runs cardholder-dp-enabled = true with"),
    ({"readout": "thesis"}, "next-event"),
    ({"init-from": "anomaly:v1"}, "init-from is not supported"),
    ({"timeout-s": 0.0}, "timeout-s must be > 0"),
    ({"dp-cardholders": "many"}, "dp-cardholders must be an integer"),
    ({"cardholder-dp-delta": 0.01}, "above 1/N"),
    ({"cardholder-dp-min-banks": 3}, "min_banks must be below banks"),
    ({"cardholder-dp-target-epsilon": 0.0, "cardholder-dp-noise-multiplier": 0.0}, "noise multiplier is 0"),
])
def test_a_setting_the_app_cannot_run_is_a_one_line_error(change, message):
    config = {**_app_config()["config"], "dp-cardholders": 600, **change}
    with pytest.raises(ConfigError, match=message) as err:
        dp_app.dp_run(config)
    assert "\n" not in str(err.value)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("dp-app-data")
    generate_dataset(root, GeneratorConfig(banks=3, cardholders=36, days=21, fraud_rate=0.03, seed=11),
                     raw_csv=False, progress=False)
    return root


def _run_config(data: Path, out: Path, cardholders: int) -> dict:
    tiny = {k: v for k, v in TINY_RUN.items() if k in RunSettings.defaults() and k not in ("client-cpus", "ray-cpus")}
    return {**_app_config()["config"], **tiny, "data-dir": str(data / "nowhere"), "out-dir": str(out),
            "registry-dir": str(out / "registry"), "cache-dir": str(out / "cache"), "rounds": 2, "local-epochs": 1,
            "samples-per-epoch": 48, "batch-size": 24, "cardholder-dp-sampling-rate": 0.6,
            "cardholder-dp-pool-per-cardholder": 40, "dp-cardholders": cardholders}


def training_cardholders(data: Path, config: dict) -> int:
    """N: the training cardholders of every bank's DP pool under ``config`` (what the federation agrees on)."""
    settings = RunSettings.from_flat({k: v for k, v in config.items() if k not in dp_app.APP_DEFAULTS})
    total = 0
    for bank in BANKS:
        own = on_node(settings, bank, {"data-dir": str(bank_dir(data, bank))})
        pairs = sources_of([bank_data(own, bank)], own.anomaly, own.egograph.max_nodes)[0].pairs
        total += len(CardholderPool.of([pairs]))
    return total


def test_a_whole_run_sums_masked_gradients_evaluates_each_block_and_publishes_the_card(
    data, tmp_path, task_identity  # noqa: F811 - fixture
):
    out = tmp_path / "server"
    n = training_cardholders(data, _run_config(data, out, 1))
    config = _run_config(data, out, n)
    contexts = {node: _bank_context(data, tmp_path, node, bank, config) for node, bank in NODES.items()}
    audit = tmp_path / "audit"
    run = dp_app.dp_run(config)
    assert run.steps == 4 and run.per_block == 2
    result = dp_app.run_dp_federation(AuditGrid(_Loopback(dp_app.client, contexts), audit),
                                      Context(7, 0, {}, RecordDict(), config), run)

    assert result["dp_rounds"] == result["dp_rounds_planned"] == 4 and result["rounds"] == 2
    assert result["version"] == "anomaly:v1"
    version = ModelRegistry(out / "registry").latest("anomaly")
    card = version.privacy["client_dp"]
    assert card["noise"] == "distributed" and card["steps"] == 4 and card["banks"] == 3
    assert card["dp_rounds_applied"] == 4 and card["cardholders"] == n
    assert card["noise_multiplier"] == run.plan.noise_multiplier
    assert card["epsilon"] == pytest.approx(run.plan.epsilon(4, run.settings.anomaly.cardholder_dp.delta))
    assert card["epsilon"] <= 8.0 + 1e-6
    assert "SecAggPlusWorkflow" in card["execution"] and card["noise_source"] == "OS entropy, in each bank"
    for bank in BANKS:  # each bank charged the run's whole plan to its own ledger, once
        [entry] = PrivacyLedger(tmp_path / f"ledger-{bank}.json").entries()
        assert entry.run.startswith("flwr-run-7:") and entry.epsilon == pytest.approx(card["epsilon"], rel=1e-9)
    metrics = version.metrics
    assert metrics["mode"] == dp_app.MODE and len(metrics["history"]) == 2
    assert set(metrics["per_bank"]) == {str(b) for b in BANKS}
    # every bank scored the model (a bank of this tiny file may have no validation pair: NaN, skipped in the mean)
    assert all({"val_loss", "loss"} <= set(m) for m in metrics["per_bank"].values())
    assert np.isfinite(metrics["val_loss_mean"])
    # the card's figures are the published block's own (lowest validation loss), not the last block's
    chosen = min(metrics["history"], key=lambda r: r["val_loss_mean"])
    assert metrics["selected_round"] == chosen["round"] == result["selected_round"]
    assert metrics["val_loss_mean"] == chosen["val_loss_mean"] == result["summary"]["val_loss_mean"]

    replies = read_audit(audit)
    train = [m for m in replies if m.metadata.message_type == MessageType.TRAIN]
    evaluate = [m for m in replies if m.metadata.message_type == MessageType.EVALUATE]
    assert len(train) == 4 * 3 * 4  # SecAgg+'s four stages, three banks, four rounds
    assert len(evaluate) == 2 * 3  # one evaluation per block and bank
    assert all(not record for m in replies for record in m.content.array_records.values())  # no clear array
    assert sum(len(masked_vectors(train[i:i + 12])) for i in range(0, len(train), 12)) == 4 * 3
    # the evaluation replies: the model's metrics on validation and test cardholders (local_test) and the bank's
    # partition id, nothing else (no gradient, no training loss, no statistic over the training cardholders)
    allowed = {"val_loss", "loss", "accuracy", "precision", "recall", "f1", "roc_auc", "fraud_roc_auc",
               "fraud_pr_auc", "fraud_n", "partition-id"}
    for msg in evaluate:  # Flower's legacy EvaluateRes: its status record (code, message) aside
        records = {**msg.content.config_records, **msg.content.metric_records}
        metrics = {k for name, record in records.items() if not name.endswith(".status") for k in record}
        assert {"val_loss", "fraud_n", "partition-id"} <= metrics, metrics  # every block scores the test frauds
        assert metrics <= allowed | {"num_examples"}, metrics - allowed


class _Leaving(_Loopback):
    """The loopback grid where the banks in ``leave`` disconnect for good after the first evaluation (the end of
    block 1): they drop out of ``get_node_ids``, and a message sent to one gets no reply, as over a SuperLink.
    """

    def __init__(self, app, contexts: dict[int, Context], leave: set[int]) -> None:
        super().__init__(app, contexts)
        self.leave = leave

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        replies = super().send_and_receive([m for m in messages if m.metadata.dst_node_id in self.contexts],
                                           timeout=timeout)
        if any(m.metadata.message_type == MessageType.EVALUATE for m in messages):
            for node in self.leave:
                self.contexts.pop(node, None)
        return replies


@pytest.mark.parametrize("leave, applied, stopped", [({9103}, 4, 0), ({9102, 9103}, 2, 3)])
def test_a_bank_gone_for_good_shrinks_the_run_to_t_banks_and_below_t_the_run_stops_and_publishes(
    data, tmp_path, task_identity, leave, applied, stopped  # noqa: F811 - fixture
):
    out = tmp_path / "server"
    n = training_cardholders(data, _run_config(data, out, 1))
    config = {**_run_config(data, out, n), "timeout-s": 2.0}
    contexts = {node: _bank_context(data, tmp_path, node, bank, config) for node, bank in NODES.items()}
    run = dp_app.dp_run(config)
    assert run.plan.survivors == 2 and run.per_block == 2
    audit = tmp_path / "audit"
    result = dp_app.run_dp_federation(AuditGrid(_Leaving(dp_app.client, contexts, leave), audit),
                                      Context(7, 0, {}, RecordDict(), config), run)
    # one bank gone: rounds 3 and 4 sum the two left (t = 2); two gone: the run stops at round 3
    assert result["dp_rounds"] == applied and result.get("stopped_at_round", 0) == stopped
    train = [m for m in read_audit(audit) if m.metadata.message_type == MessageType.TRAIN]
    assert len(train) == 4 * (3 * 2 + (3 - len(leave)) * (applied - 2))  # SecAgg+'s four stages per bank and round
    # block 2 was evaluated by fewer than every bank: not a candidate, so block 1 is published
    version = ModelRegistry(out / "registry").latest("anomaly")
    assert version.metrics["selected_round"] == result["selected_round"] == 1
    card = version.privacy["client_dp"]
    assert card["dp_rounds_applied"] == applied and card.get("stopped_at_round", 0) == stopped
    assert card["epsilon"] == pytest.approx(run.plan.epsilon(4, run.settings.anomaly.cardholder_dp.delta))


def _bank_context(data: Path, out: Path, node: int, bank: int, config: dict, run_id: int = 7,
                  **node_config) -> Context:
    """Bank ``bank``'s context on ``node``, its privacy ledger under ``out``."""
    return Context(run_id, node, {"partition-id": bank, "data-dir": str(bank_dir(data, bank)),
                                  LEDGER_KEY: str(out / f"ledger-{bank}.json"), **node_config}, RecordDict(), config)


def test_a_bank_refuses_the_run_that_would_pass_its_lifetime_budget(data, tmp_path, task_identity):  # noqa: F811
    out = tmp_path / "server"
    config = _run_config(data, out, training_cardholders(data, _run_config(data, out, 1)))
    run = dp_app.dp_run(config)
    delta = run.settings.anomaly.cardholder_dp.delta
    one_run, two_runs = run.plan.epsilon(run.steps, delta), run.plan.epsilon(2 * run.steps, delta)
    budget = {BUDGET_KEY: (one_run + two_runs) / 2}  # room for one run, not two (RDP: two compose to less than 2ε)

    def federation(run_id: int):
        contexts = {node: _bank_context(data, tmp_path, node, bank, config, run_id, **budget)
                    for node, bank in NODES.items()}
        audit = tmp_path / f"audit-{run_id}"
        grid = AuditGrid(LoopbackGrid(dp_app.client, contexts, run_id), audit)  # errors come back as a SuperNode's
        return grid, audit, Context(run_id, 0, {}, RecordDict(), config)

    grid, _, server = federation(7)
    assert dp_app.run_dp_federation(grid, server, run)["dp_rounds"] == 4
    grid, audit, server = federation(8)
    with pytest.raises(RuntimeError, match="nothing to publish: 0 of 4 DP rounds applied"):
        dp_app.run_dp_federation(grid, server, run)
    # every bank refused its first round of run 8 before releasing anything: no masked vector, the fixed text only
    replies = read_audit(audit)
    assert not masked_vectors([m for m in replies if m.has_content()])
    refusals = [m for m in replies if m.has_error()]
    assert refusals and all(m.error.reason.endswith(f":<'{REFUSAL}'>") for m in refusals)
    for bank in BANKS:
        ledger = PrivacyLedger(tmp_path / f"ledger-{bank}.json", budget[BUDGET_KEY])
        assert [e.run.split(":")[0] for e in ledger.entries()] == ["flwr-run-7"]
        assert ledger.spent()[0] == pytest.approx(one_run, rel=1e-9)


def test_a_bank_refuses_a_test_noise_seed_a_foreign_plan_a_replayed_step_and_steps_past_its_budget(data, tmp_path):
    from fedfraud.training.anomaly.distributed_dp import trainable
    from fedfraud.training.federated.dp_fedsgd import (
        NOISE_SEED_KEY, PLAN_KEY, REFUSAL, STEP_KEY, BankRefused, _Client, plan_digest,
    )

    config = _run_config(data, tmp_path, 10_000)
    with pytest.raises(ConfigError, match="tests only, refused here"):
        dp_app._bank_for(_bank_context(data, tmp_path, 9201, 0, config, **{NOISE_SEED_KEY: 3}))
    context = _bank_context(data, tmp_path, 9202, 0, config)
    bank = dp_app._bank_for(context)
    assert bank.max_steps == 4 and plan_digest(bank.plan) == plan_digest(dp_app.dp_run(config).plan)
    client = _Client(bank, context, None)
    weights = [p.detach().numpy().copy() for _, p in trainable(bank.model)]
    good = {PLAN_KEY: plan_digest(bank.plan), **secagg_prg.fit_config()}
    other_prg = {**good, secagg_prg.CONFIG_KEY: "flower-randomstate"}  # a server on Flower's mask generator
    for bad in ({STEP_KEY: 1, PLAN_KEY: "0" * 16}, {STEP_KEY: 0, **good}, {STEP_KEY: 1, **other_prg}):
        with pytest.raises(BankRefused) as err:
            client.fit(weights, bad)
        assert str(err.value) == REFUSAL
    for step in (1, 2, 3, 4):
        residues, weight, metrics = client.fit(weights, {STEP_KEY: step, **good})
        assert weight == 1 and metrics == {} and residues[0].shape == (bank.plan.dims,)
    for bad in ({STEP_KEY: 4, **good}, {STEP_KEY: 5, **good}):  # a replay; then past the 4-step budget
        with pytest.raises(BankRefused, match="the bank refused"):
            client.fit(weights, bad)
    # the SuperNode restarts (its in-memory state is gone): the ledger on disk still refuses more of run 7
    restarted = _Client(bank, _bank_context(data, tmp_path, 9202, 0, config), None)
    for bad in ({STEP_KEY: 5, **good}, {STEP_KEY: 1, **good}):
        with pytest.raises(BankRefused, match="the bank refused"):
            restarted.fit(weights, bad)
    [entry] = PrivacyLedger(tmp_path / "ledger-0.json").entries()
    assert (entry.steps, entry.last_step) == (4, 4)
