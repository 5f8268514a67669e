"""Centralized upper bound: the same model, data and settings trained on all banks' pairs in one process.

Each "round" runs ``local_epochs`` epochs of ``samples_per_epoch × banks``
pairs, the gradient work of one federated round summed over banks; the Adam
state carries over between rounds. Negatives of a pair still come from its
own bank's pool. Checkpoints and resume work as in the federated run.
"""

from __future__ import annotations

import logging
import time

import torch

from fedfraud.feature_store.privacy import feature_ldp_card
from fedfraud.training.anomaly.engine import sources_of, train_model
from fedfraud.training.anomaly.model import pick_device
from fedfraud.training.anomaly.run import Checkpoint, RoundRecord, checkpoint_dir, log_round, publish_run
from fedfraud.training.federated.accountant import dp_off_card
from fedfraud.training.anomaly.federated.task import RunSettings, bank_data, initial_model, local_test, lr_factor
from fedfraud.training.anomaly.federated.trainer import RunResult, prepare
from fedfraud.training.registry import ModelRegistry

__all__ = ["run_centralized"]

logger = logging.getLogger(__name__)


def run_centralized(settings: RunSettings, threads: int = 1) -> RunResult:
    """Train centrally, checkpoint each round, publish; returns the run's summary."""
    from tqdm.auto import tqdm

    banks = prepare(settings, "centralized")
    torch.set_num_threads(threads)
    directory = checkpoint_dir(settings.out_dir, "centralized")
    flat = settings.to_flat()
    model = initial_model(settings).to(pick_device())
    checkpoint = Checkpoint.load(directory) if settings.resume else None
    if checkpoint is None:
        checkpoint = Checkpoint(0, model.state_dict(), [], flat)
    else:
        model.load_state_dict(checkpoint.state_dict)
        logger.info("resuming from round=%d checkpoint=%s", checkpoint.round, directory)
    start = time.perf_counter()
    data = [bank_data(settings, b) for b in banks]
    checkpoint.privacy = {b.bank: vars(b.privacy) for b in data}
    cfg = settings.anomaly
    sources = sources_of(data, cfg, settings.egograph.max_nodes)
    rounds = settings.federated.rounds
    for rnd in tqdm(range(checkpoint.round + 1, rounds + 1), desc="centralized rounds", unit="round"):
        t0 = time.perf_counter()
        stats, opt_state = train_model(
            model,
            sources,
            epochs=cfg.local_epochs,
            samples_per_epoch=cfg.samples_per_epoch * len(data),
            batch_size=cfg.batch_size,
            lr=cfg.lr * lr_factor(cfg, rnd, rounds),
            seed=[cfg.seed, 10_000, rnd],
            aux_weight=cfg.aux_weight,
            optimizer_state=checkpoint.optimizer,
        )
        per_bank = {b.bank: local_test(model, b) for b in data}
        record = RoundRecord(rnd, stats.loss_last, per_bank, time.perf_counter() - t0)
        checkpoint.optimizer = opt_state
        checkpoint.offer(record, model.state_dict())
        checkpoint.save(directory)
        log_round(record, rounds, "centralized")
    wall = time.perf_counter() - start
    version = None
    if settings.publish and checkpoint.history:
        selected, weights = checkpoint.selected
        version = publish_run(
            ModelRegistry(settings.registry_dir),
            weights,
            selected_round=selected,
            mode="centralized",
            anomaly_cfg=cfg,
            encoder_cfg=settings.encoder,
            ego_cfg=settings.egograph,
            config={**settings.config_dump(), "mode": "centralized"},
            history=checkpoint.history,
            privacy=checkpoint.privacy,
            client_dp=dp_off_card(
                "centralized run: every bank's data was pooled in one process, so no federated update was "
                "released and no client-level DP applies"
            ),
            feature_ldp=feature_ldp_card(settings.privacy),
        ).tag
    return RunResult(
        "centralized",
        checkpoint.round,
        len(banks),
        wall,
        checkpoint.selected_summary,
        [r.seconds for r in checkpoint.history],
        version,
    )
