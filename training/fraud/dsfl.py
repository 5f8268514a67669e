"""``aggregation: dsfl`` for the neural fraud variants (the federated GNN, FED-SPFD): the server's plan, its
weighting step and the model card's privacy statement.

The bank's half is the shared mod (:func:`fedfraud.training.federated.dsfl_mod.dsfl_client_mod`, reading the
settings the server sends under :data:`~fedfraud.training.federated.dsfl_mod.DSFL_KEY`): every train reply's
update of the federated arrays is L1-clipped and Laplace-noised per dimension before it leaves the bank. The
server calibrates the ε's to ``dsfl.target_epsilon`` over every round in which the banks send arrays, with the
anomaly model's accountant (:func:`~fedfraud.training.federated.dsfl.dsfl_epsilon`), and moves the model by the
contribution-weighted mean of the noised updates instead of the variant's weighted mean. What a variant sends
beside its arrays (FedRPDA's risk intensities and prototypes, FED-SPFD's embedding statistics, scaler sums,
validation histograms) flows as before and is not covered by DSFL's noise; the card says so. DSFL's shared
public slice is the anomaly model's only (:func:`~fedfraud.training.federated.config.refuse_public_slice`).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, Message

from fedfraud.training.federated.config import DSFLConfig
from fedfraud.training.federated.dsfl import calibrate, dsfl_card, weigh_replies
from fedfraud.training.federated.dsfl_mod import DSFL_KEY

__all__ = ["DSFLPlan", "client_dp_of", "dp_off", "float_coordinates", "privacy_statement"]

logger = logging.getLogger(__name__)


def float_coordinates(arrays: ArrayRecord, fixed: Collection[str] = ()) -> int:
    """How many float coordinates DSFL clips, selects among and noises: the float arrays sent, but ``fixed``."""
    return sum(int(a.numpy().size) for k, a in arrays.items()
               if k not in fixed and np.issubdtype(a.numpy().dtype, np.floating))


@dataclass
class DSFLPlan:
    """One job's DSFL: the calibrated settings, the rounds and coordinates they are charged for, and the global
    model of the current round (set by the strategy's ``configure_train``).
    """

    cfg: DSFLConfig
    rounds: int
    coordinates: int
    received: ArrayRecord | None = None

    @classmethod
    def of(cls, cfg: DSFLConfig, rounds: int, arrays: ArrayRecord, fixed: Collection[str] = ()) -> DSFLPlan:
        """The plan of a job whose banks send ``arrays`` (all but ``fixed`` noised) in ``rounds`` rounds."""
        n = float_coordinates(arrays, fixed)
        calibrated = calibrate(cfg, rounds, n)
        logger.info("dsfl plan rounds=%d coordinates=%d target_epsilon=%g (%s) epsilon_select=%.5g epsilon_top=%.5g "
                    "epsilon_rest=%.5g", rounds, n, cfg.target_epsilon, cfg.target_unit, calibrated.epsilon_select,
                    calibrated.epsilon_top, calibrated.epsilon_rest)
        return cls(calibrated, rounds, n)

    def config(self) -> dict[str, str]:
        """The train-config entry the banks' DSFL mod reads."""
        return {DSFL_KEY: self.cfg.model_dump_json()}

    def aggregate(self, server_round: int, replies: Sequence[Message]) -> tuple[ArrayRecord | None, np.ndarray]:
        """(the next global arrays, or None when no bank contributes; the banks' weights in reply order)."""
        if self.received is None:
            raise RuntimeError("dsfl: aggregate before configure_train set the round's global model")
        base = {k: v.numpy() for k, v in self.received.items()}
        return weigh_replies(base, replies, self.cfg.keep_banks, server_round)

    def card(self, banks: int, side_channels: str, fixed: Collection[str] = ()) -> dict[str, Any]:
        """The card's ``client_dp`` entry (:func:`dsfl_card`), naming the variant's uncovered side channels."""
        entry = dsfl_card(self.cfg, self.rounds, self.coordinates, banks)
        if entry.get("dp") == "on":
            entry["not_covered"] = f"{side_channels}; {entry['not_covered']}"
            if fixed:
                entry["returned_as_received"] = (f"{', '.join(sorted(fixed))}: set by the server, never trained by a "
                                                 "bank, sent back unchanged (no noise, no coordinates)")
        return entry


def dp_off(why: str) -> dict[str, Any]:
    """The card's ``client_dp`` entry of a run without DSFL."""
    return {"dp": "off", "epsilon": "none", "why": why}


def client_dp_of(meta: dict[str, Any], aggregation: str) -> dict[str, Any]:
    """A trained model's ``client_dp`` entry (``meta["client_dp"]``, from its run's server); DP off for a model
    without one, unless its settings say DSFL (then its accountant's entry is missing: refused).
    """
    if "client_dp" in meta:
        return dict(meta["client_dp"])
    if aggregation == "dsfl":
        raise ValueError("a model trained under aggregation dsfl must carry its run's client_dp entry")
    return dp_off(f"aggregation {aggregation}: what leaves a bank is not noised")


def privacy_statement(entry: dict[str, Any], model: str) -> tuple[str, dict[str, Any]]:
    """(the card's privacy sentence, the registry's privacy fields) of a fraud variant's ``client_dp`` entry."""
    if entry.get("dp") != "on":
        return (f"Differential privacy is **off** ({entry.get('why', 'no DSFL')}).",
                {"formal_guarantee": f"none: no (epsilon, delta) is claimed for {model} or what its training sent",
                 "client_dp": entry})
    eps, delta, rounds = entry["epsilon"], entry["delta"], entry["rounds"]
    guarantee = (f"({eps:.3g}, {delta:g})-DP per cardholder (any change to one bank's data) over all {rounds} DSFL "
                 "rounds, for the model-array updates every bank sends and every released model (Laplace noise "
                 f"added inside each bank; ({entry['epsilon_bank']:.3g}, {delta:g}) per bank against a zero update). "
                 f"NOT covered: {entry['not_covered']}")
    sentence = (f"Differential privacy: **DSFL** on the model arrays, (ε={eps:.3g}, δ={delta:g}) per cardholder over "
                f"{rounds} rounds (ε={entry['epsilon_bank']:.3g} per bank against a zero update); NOT covered: "
                f"{entry['not_covered']}.")
    return sentence, {"formal_guarantee": guarantee, "client_dp": entry}
