"""Typed configuration of the federated run (Flower simulation on Ray) and of its client-level DP."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["AGGREGATIONS", "Aggregation", "AttackConfig", "DPConfig", "DSFLConfig", "FederatedConfig",
           "ModelAggregation", "ModelAggregationConfig"]

#: How the server combines the banks' models: FedAvg (the weighted mean, FedProx's), a robust rule of Flower's, or
#: DSFL (contribution-weighted banks, per-dimension Laplace noise added inside each bank: training/federated/dsfl.py).
Aggregation = Literal["fedavg", "fedmedian", "fedtrimmedavg", "krum", "multikrum", "dsfl"]
AGGREGATIONS: tuple[str, ...] = ("fedavg", "fedmedian", "fedtrimmedavg", "krum", "multikrum", "dsfl")

_ATTACK = re.compile(r"^(|none|flip-targets|scale:[-+]?[0-9]*\.?[0-9]+(e[-+]?[0-9]+)?)$")


class DPConfig(BaseModel):
    """Client-level differential privacy on the anomaly model's federated updates (issue 15).

    Each bank clips its update (new weights − the global weights it received) to
    ``clipping_norm`` in L2 before it leaves the bank; the server averages the
    banks' clipped updates with equal weights and adds Gaussian noise of std
    ``noise_multiplier × clipping_norm / banks per round``. The unit of privacy is
    one bank's whole contribution; the RDP accountant composes all rounds.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(False, description="clip and noise the anomaly model's updates (off: no (ε, δ) claimed)")
    noise_multiplier: float = Field(
        1.0, gt=0.0, description="σ / clipping_norm of the Gaussian noise on the sum; ignored if target_epsilon > 0"
    )
    target_epsilon: float = Field(
        0.0, ge=0.0, description="> 0: calibrate noise_multiplier so that all rounds together spend this ε at δ"
    )
    delta: float = Field(1e-5, gt=0.0, lt=1.0, description="δ of the reported (ε, δ); keep it ≪ 1/number of banks")
    clipping_norm: float = Field(
        1.0, gt=0.0, description="L2 bound on one bank's update per round (all parameters together)"
    )


class DSFLConfig(BaseModel):
    """DSFL (Mao & Wang 2023; ``aggregation: dsfl``): contribution-weighted banks and per-dimension Laplace noise.

    Inside each bank, every round: the update (new − received weights) is clipped to ``l1_clip`` in L1; the
    exponential mechanism (budget ε₁ = ``epsilon_select``, split over the draws) picks the ``top_fraction`` of
    coordinates with the largest |update|; those get Laplace noise of scale ``l1_clip / epsilon_top`` (ε₂), the
    others ``l1_clip / epsilon_rest`` (ε₃). The server weights banks by their contribution
    (AdaBoost's ½ ln((1 − err)/err)) and keeps the ``keep_banks`` best. With ``public_cardholders`` every bank
    also trains on a public synthetic slice (the paper's shared data S, against client divergence). Accounting:
    training/federated/dsfl.py.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    noise: bool = Field(True, description="add the per-dimension Laplace noise (off: the weighting only, no ε)")
    epsilon_select: float = Field(0.1, gt=0.0, description="ε₁ per round: the exponential-mechanism selection")
    epsilon_top: float = Field(1.0, gt=0.0, description="ε₂ per round: Laplace budget of the selected coordinates")
    epsilon_rest: float = Field(0.5, gt=0.0, description="ε₃ per round: Laplace budget of the other coordinates")
    top_fraction: float = Field(
        0.1, gt=0.0, le=1.0, description="share m/n of the coordinates selected for the ε₂ noise")
    l1_clip: float = Field(1.0, gt=0.0, description="L1 bound on one bank's update per round (the Laplace Δ)")
    target_epsilon: float = Field(
        0.0, ge=0.0, description="> 0: scale ε₁, ε₂, ε₃ by one factor so that all rounds spend this ε per bank "
        "(add/remove one bank) at delta")
    target_unit: Literal["bank", "cardholder"] = Field(
        "bank", description="unit of target_epsilon: bank (the report against a zero update, for comparisons with "
        "federated.dp) or cardholder (any change to one bank's data, for comparisons with cardholder-level DP-SGD)")
    delta: float = Field(1e-5, gt=0.0, lt=1.0, description="δ of the reported (ε, δ)")
    keep_banks: int = Field(0, ge=0, description="banks kept per round, best contribution first; 0 = every bank "
                            "with a positive weight")
    seed: int = Field(-1, ge=-1, description="noise seed (bank's seed + bank id + round); -1 = OS entropy")
    public_cardholders: int = Field(
        0, ge=0, description="the shared public slice (paper's S): cardholders of a slice of the project's own "
        "generator, public seed, that every bank trains on besides its own data; 0 = none")
    public_seed: int = Field(20230, ge=0, description="generator seed of the public slice (public, like the slice)")


#: How a neural fraud variant (federated GNN, FED-SPFD) combines its banks' model arrays: the variant's own weighted
#: mean, or DSFL (training/fraud/dsfl.py).
ModelAggregation = Literal["fedavg", "dsfl"]


class ModelAggregationConfig(BaseModel):
    """``aggregation`` and ``dsfl`` of a neural fraud variant's settings (``fraud.gnn``, ``fraud.spfd``).

    DSFL's shared public slice is refused there: the slice is generator output featurised by the anomaly pipeline;
    the fraud variants' inputs (cross-fitted anomaly score, merchant risk, a bank's private columns, its graph)
    would need the whole fraud pipeline run on it in every bank.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    aggregation: ModelAggregation = Field(
        "fedavg", description="fedavg: the variant's weighted mean (FedRPDA's risk-aware weights when on); dsfl: "
        "DSFL's contribution weighting of updates each bank noised (settings in dsfl)")
    dsfl: DSFLConfig = Field(default_factory=DSFLConfig, description="aggregation dsfl: noise, budget (target_epsilon "
                             "over every round that sends the model) and weights; public_cardholders must stay 0")

    @model_validator(mode="after")
    def _no_public_slice(self) -> ModelAggregationConfig:
        if self.dsfl.public_cardholders:
            raise ValueError("dsfl.public_cardholders (DSFL's shared public slice) is the anomaly model's only; a "
                             "neural fraud variant needs it 0")
        return self


class AttackConfig(BaseModel):
    """One malicious bank, simulated: for ``fedfraud bench adversary`` and the tests only, never a deployment knob.

    ``scale:F``: the bank trains honestly, then sends ``received + F × (its update)`` and skips the clipping mod
    (modified software: ``scale:-1`` flips the sign, ``scale:-10`` flips and amplifies). ``flip-targets``: data
    poisoning with honest software: the bank trains on shuffled targets (each history is taught another
    cardholder's next event; BCE labels swapped for the pair and contrastive readouts) and sends that update
    through the normal path, clipping included.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: str = Field("", description='"" (no attack), "scale:<factor>" or "flip-targets"')
    bank: int = Field(0, ge=0, description="partition id of the malicious bank")

    @field_validator("mode")
    @classmethod
    def _known(cls, value: str) -> str:
        if not _ATTACK.match(value):
            raise ValueError(f'unknown attack {value!r}; use "", "scale:<factor>" or "flip-targets"')
        return "" if value == "none" else value

    @property
    def scale(self) -> float | None:
        """The factor of a ``scale:F`` attack, else None."""
        return float(self.mode.split(":", 1)[1]) if self.mode.startswith("scale:") else None


class FederatedConfig(BaseModel):
    """FedProx rounds and client resources; the thesis runs 200 rounds over 5 banks."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rounds: int = Field(200, ge=1, description="federated rounds (thesis: 200)")
    proximal_mu: float = Field(0.01, ge=0.0, description="FedProx μ: clients add (μ/2)‖w − w_global‖² to the loss")
    fraction_train: float = Field(1.0, gt=0.0, le=1.0, description="share of banks sampled per round")
    client_cpus: float = Field(1.0, gt=0.0, description="CPUs Ray reserves per simulated bank")
    client_gpus: float = Field(
        -1.0, ge=-1.0, description="GPUs per simulated bank; -1 = auto: 1/banks of one GPU when CUDA exists, else 0"
    )
    ray_cpus: int = Field(2, ge=1, description="CPUs the local Ray instance may use")
    ray_host: str = Field(
        "127.0.0.1", min_length=1,
        description="address the simulation's Ray (GCS, raylet, workers) listens on; the simulation runs on one "
        "machine, so loopback (fedfraud.core.net.ray_bind)")
    dp: DPConfig = Field(default_factory=DPConfig, description="client-level DP on the updates (run keys dp-*)")
    aggregation: Aggregation = Field(
        "multikrum",
        description="server rule: multikrum (default, chosen by fedfraud bench adversary: docs/benchmarks.md), fedavg "
        "(FedProx's mean), fedmedian, fedtrimmedavg, krum, dsfl (settings in dsfl)")
    dsfl: DSFLConfig = Field(default_factory=DSFLConfig, description="aggregation dsfl: noise and weights (dsfl-*)")
    trim_beta: float = Field(
        0.2, ge=0.0, lt=0.5, description="fedtrimmedavg: share of banks cut at each end per coordinate")
    byzantine_banks: int = Field(1, ge=0, description="krum/multikrum: how many malicious banks to tolerate (f)")
    multikrum_keep: int = Field(
        0, ge=0, description="multikrum: updates averaged; 0 = banks per round − f; never fewer than two when two "
        "banks answered (one would be released verbatim)")
    attack: AttackConfig = Field(
        default_factory=AttackConfig, description="simulated malicious bank (run keys attack-*; bench/tests only)")

    @model_validator(mode="after")
    def _one_noise(self) -> FederatedConfig:
        if self.aggregation == "dsfl" and self.dp.enabled:
            raise ValueError("aggregation dsfl adds its own Laplace noise in the banks; switch federated.dp off")
        return self
