"""Typed ``retrain:`` section: when cycles run, on which window, and when a challenger may take over."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["RetrainConfig"]


class RetrainConfig(BaseModel):
    """Knobs of the retraining loop (issue 13), each with the reason for its default."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schedule: str = Field(
        "0 3 * * *", description="crontab expression (UTC) of scheduled cycles; nightly, after the day's labels"
    )
    window_days: float = Field(30.0, gt=0, description="days of each bank's history one cycle trains on")
    label_maturity_days: float = Field(
        2.0, ge=0, description="an unlabelled transaction older than this counts as genuine (no chargeback came); "
        "younger unlabelled ones are left out of the cycle's window")
    rounds: int | None = Field(None, ge=1, description="federated rounds of a cycle (None: federated.rounds)")
    min_frauds: int = Field(
        20, ge=1, description="labelled frauds scored by both models before the policy may decide")
    bootstrap_reps: int = Field(500, ge=50, description="cardholder-bootstrap replicates of the policy")
    fpr_target: float = Field(0.01, gt=0, lt=1, description="FPR at which the policy reads recall")
    seed: int = 0
    drift_psi_threshold: float = Field(
        0.25, gt=0, description="PSI above which an input has shifted (0.1 watch, 0.25 act is the usual rule)")
    drift_reference_days: float = Field(
        3.0, gt=0, description="the drift reference is the last days of the training window: counts, velocities and "
        "novelty grow with a card's observed history, so on unchanged traffic a reference from the window's start "
        "showed PSI 3.7 (time_novelty), the last 7 days 0.73, the last 3 days 0.16 (docs/benchmarks.md)")
    drift_ignore: tuple[str, ...] = Field(
        ("n_prior",), description="inputs whose PSI is exported but never triggers a cycle: a card's transaction "
        "count only grows, so its live distribution leaves any reference by construction")
    drift_min_rows: int = Field(500, ge=50, description="live rows in the window before PSI is reported")
    drift_window_rows: int = Field(5000, ge=100, description="sliding window of live rows PSI is computed over")
    drift_check_s: float = Field(30.0, gt=0, description="how often the scheduler reads the drift gauges")
    drift_cooldown_s: float = Field(
        3600.0, ge=0, description="no second drift-triggered cycle within this long of the last one")
    metrics_url: str | None = Field(
        None, description="serving's /metrics URL the scheduler reads drift from (None: no drift trigger)")
    metrics_token_file: str | None = Field(
        None, description="file with serving's API token, sent as a bearer token to metrics_url (a mounted Secret); "
        "None: $FEDFRAUD_API_TOKEN")
    policy_check_s: float = Field(60.0, gt=0, description="how often the scheduler runs the promotion policy")
    nice: int = Field(
        10, ge=0, le=19, description="CPU niceness of a scheduled cycle's process (and the Ray it starts): a cycle "
        "that shares cores with serving must not take them from the scoring path (0: same priority)")

    @field_validator("schedule")
    @classmethod
    def _crontab(cls, value: str) -> str:
        from apscheduler.triggers.cron import CronTrigger

        try:
            CronTrigger.from_crontab(value, timezone="UTC")
        except ValueError as exc:
            raise ValueError(f"not a crontab expression ({exc})") from None
        return value
