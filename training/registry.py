"""Versioned model artifacts: weights, full config, metrics, privacy budget and a model card.

Layout::

    ROOT/<kind>/v0001/metadata.json   kind, version, created_at, config, metrics, privacy, extra
    ROOT/<kind>/v0001/MODEL_CARD.md   short human-readable card generated from metadata
    ROOT/<kind>/v0001/<files>          whatever the trainer wrote (model.pt, model.json, tokenizer.json, ...)
    ROOT/<kind>/aliases.json          {"champion": 3, "challenger": 4}: which version decides, which shadows
    ROOT/<kind>/audit.jsonl           append-only: every alias change, who/what made it, why, on what evidence

A version is written into a hidden staging folder and published with one
``os.rename``, which is atomic on POSIX: a reader (serving's hot-swap watcher)
either sees a complete version or none. Serving loads models only through
:class:`ModelRegistry`.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fedfraud.core.errors import UserError
from fedfraud.core.retry import retrying

__all__ = ["ALIASES", "ModelRegistry", "ModelVersion", "RegistryError"]

log = logging.getLogger(__name__)

METADATA_FILE = "metadata.json"
CARD_FILE = "MODEL_CARD.md"
ALIASES_FILE = "aliases.json"
AUDIT_FILE = "audit.jsonl"
#: Names that point at a version: ``champion`` decides, ``challenger`` shadows it.
ALIASES = ("champion", "challenger")
#: The command that publishes each kind, named in the error for an empty registry.
TRAIN_COMMANDS = {"anomaly": "fedfraud train anomaly", "fraud": "fedfraud train fraud",
                  "tokenizer": "fedfraud tokenizer train", "hin2vec": "fedfraud train embeddings"}


def _taken(exc: BaseException) -> bool:
    """The rename failed because the version folder exists (another publisher took that number): retry with the
    next. A full disk or a permission error is raised at once.
    """
    return isinstance(exc, OSError) and exc.errno in (errno.EEXIST, errno.ENOTEMPTY)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive advisory lock on ``path`` (POSIX ``flock``) for the block."""
    import fcntl

    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class RegistryError(UserError):
    """A requested model kind or version does not exist, or an artifact is incomplete."""


@dataclass(frozen=True, order=True)
class ModelRef:
    """A published model's identity. It travels as ``fraud:v3`` (decision records, logs, aliases' evidence);
    :meth:`parse` is the one place that text is read back.
    """

    kind: str
    version: int

    def __str__(self) -> str:
        return f"{self.kind}:v{self.version}"

    @classmethod
    def parse(cls, tag: str) -> ModelRef:
        """``"fraud:v3"`` → ``ModelRef("fraud", 3)``; anything else is a :class:`RegistryError`."""
        kind, sep, number = str(tag).rpartition(":v")
        if not sep or not kind or not number.isdecimal() or len(number) > 9:
            raise RegistryError(f"{tag!r} is not a model tag such as fraud:v3")
        return cls(kind, int(number))

    @classmethod
    def maybe(cls, tag: str) -> ModelRef | None:
        """The reference, or None when ``tag`` names no registry model (a custom loader's own label)."""
        try:
            return cls.parse(tag)
        except RegistryError:
            return None


@dataclass(frozen=True)
class ModelVersion:
    """One published, immutable model version."""

    kind: str
    version: int
    path: Path
    created_at: str
    config: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    privacy: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ref(self) -> ModelRef:
        return ModelRef(self.kind, self.version)

    @property
    def tag(self) -> str:
        """Short identifier such as ``anomaly:v3`` used in logs and decision records."""
        return str(self.ref)

    def file(self, name: str) -> Path:
        """Path of an artifact file; raises :class:`RegistryError` if the trainer did not write it."""
        path = self.path / name
        if not path.exists():
            raise RegistryError(f"{self.tag} has no artifact {name!r}")
        return path

    @property
    def model_card(self) -> str:
        return (self.path / CARD_FILE).read_text(encoding="utf-8")


def _jsonable(value: Any) -> Any:
    """Make config/metric values JSON-safe (numpy scalars, paths, tuples)."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item") and callable(value.item):
        return value.item()
    if isinstance(value, float | int | str | bool) or value is None:
        return value
    return str(value)


def _render_card(meta: dict[str, Any], card: str | None) -> str:
    lines = [f"# Model card: {meta['kind']} v{meta['version']}", "", f"Created: {meta['created_at']}", ""]
    if card:
        lines += [card.strip(), ""]
    for title, key in (("Metrics", "metrics"), ("Privacy", "privacy")):
        if meta.get(key):
            lines += [f"## {title}", ""]
            for k, v in meta[key].items():
                if isinstance(v, dict) and v and not all(str(x).isdigit() for x in v):
                    lines.append(f"- **{k}**:")  # a sub-section (e.g. privacy.client_dp) reads as a nested list
                    lines += [f"  - {k2}: {v2}" for k2, v2 in v.items()]
                else:
                    lines.append(f"- **{k}**: {v}")
            lines.append("")
    config = json.dumps(meta.get("config", {}), indent=2, sort_keys=True)
    lines += ["## Configuration", "", "```json", config, "```", ""]
    return "\n".join(lines)


class ModelRegistry:
    """A folder of versioned model artifacts, one sub-folder per model kind."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)

    def _kind_dir(self, kind: str) -> Path:
        if not kind or "/" in kind or kind.startswith("."):
            raise RegistryError(f"invalid model kind {kind!r}")
        return self.root / kind

    def versions(self, kind: str) -> list[ModelVersion]:
        """All published versions of ``kind``, oldest first."""
        kind_dir = self._kind_dir(kind)
        if not kind_dir.is_dir():
            return []
        found = []
        for child in kind_dir.iterdir():
            if child.is_dir() and child.name.startswith("v") and child.name[1:].isdigit():
                if (child / METADATA_FILE).exists():
                    found.append(self._load(child))
        return sorted(found, key=lambda v: v.version)

    def latest(self, kind: str) -> ModelVersion | None:
        """Newest version of ``kind``, or None if none is published."""
        versions = self.versions(kind)
        return versions[-1] if versions else None

    def get(self, kind: str, version: int | str = "latest") -> ModelVersion:
        """A version by number (3, ``"v3"``), ``"latest"`` or an alias (``"champion"``, ``"challenger"``).

        ``champion`` falls back to ``latest`` while no version was ever promoted,
        so a fresh registry serves what it trained. Raises :class:`RegistryError` if absent.
        """
        if version in ALIASES:
            number = self.aliases(kind).get(str(version))
            if number is None:
                if version != "champion":
                    raise RegistryError(f"no {kind!r} {version} in registry {self.root}")
                return self.get(kind, "latest")
            return self.get(kind, number)
        if version == "latest":
            found = self.latest(kind)
            if found is None:
                how = TRAIN_COMMANDS.get(kind)
                raise RegistryError(f"no {kind!r} model in registry {self.root}; train one first"
                                    + (f" (`{how}`)" if how else ""))
            return found
        try:
            number = int(str(version).lstrip("v"))
        except ValueError:
            raise RegistryError(f"{version!r} is not a version: use 3, v3, latest, champion or challenger") from None
        path = self._kind_dir(kind) / f"v{number:04d}"
        if not (path / METADATA_FILE).exists():
            raise RegistryError(f"{kind}:v{number} is not in registry {self.root}")
        return self._load(path)

    def get_ref(self, ref: ModelRef | str) -> ModelVersion:
        """The version a :class:`ModelRef` (or its ``fraud:v3`` text) names."""
        ref = ref if isinstance(ref, ModelRef) else ModelRef.parse(ref)
        return self.get(ref.kind, ref.version)

    # ------------------------------------------------------------------ aliases and their audit log
    def aliases(self, kind: str) -> dict[str, int]:
        """``{alias: version}`` of ``kind`` (empty until something is promoted or registered as challenger)."""
        path = self._kind_dir(kind) / ALIASES_FILE
        return {k: int(v) for k, v in json.loads(path.read_text(encoding="utf-8")).items()} if path.exists() else {}

    def audit(self, kind: str) -> list[dict[str, Any]]:
        """Every alias change of ``kind``, oldest first (append-only ``audit.jsonl``)."""
        path = self._kind_dir(kind) / AUDIT_FILE
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]

    def set_alias(self, kind: str, alias: str, version: int | str | None, *, actor: str, reason: str,
                  evidence: dict[str, Any] | None = None) -> dict[str, Any]:
        """Point ``alias`` at ``version`` (None removes it) and append who, when, why and on what evidence.

        The alias file is replaced atomically and the audit line appended under
        an exclusive lock, so two writers never interleave; readers (serving's
        watcher) see the old or the new alias, never a torn file.
        """
        if alias not in ALIASES:
            raise RegistryError(f"unknown alias {alias!r}; aliases are {', '.join(ALIASES)}")
        number = None if version is None else self.get(kind, version).version
        kind_dir = self._kind_dir(kind)
        kind_dir.mkdir(parents=True, exist_ok=True)
        with _locked(kind_dir / ".aliases.lock"):
            current = self.aliases(kind)
            entry = {"at": datetime.now(UTC).isoformat(timespec="seconds"), "kind": kind, "alias": alias,
                     "from": current.get(alias), "to": number, "actor": actor, "reason": reason,
                     "evidence": _jsonable(evidence or {})}
            if number is None:
                current.pop(alias, None)
            else:
                current[alias] = number
            tmp = kind_dir / f".{ALIASES_FILE}.tmp"
            tmp.write_text(json.dumps(current, indent=2, sort_keys=True), encoding="utf-8")
            os.replace(tmp, kind_dir / ALIASES_FILE)
            with (kind_dir / AUDIT_FILE).open("a", encoding="utf-8") as log_file:
                log_file.write(json.dumps(entry, sort_keys=True) + "\n")
        log.info("registry alias kind=%s %s: %s -> %s by %s (%s)", kind, alias, entry["from"], number, actor, reason)
        return entry

    def promote(self, kind: str, version: int | str, *, actor: str, reason: str,
                evidence: dict[str, Any] | None = None) -> dict[str, Any]:
        """Make ``version`` the champion; it stops being the challenger if it was one."""
        entry = self.set_alias(kind, "champion", version, actor=actor, reason=reason, evidence=evidence)
        if self.aliases(kind).get("challenger") == entry["to"]:
            self.set_alias(kind, "challenger", None, actor=actor, reason=f"promoted to champion: {reason}")
        return entry

    def rollback(self, kind: str, *, actor: str, reason: str) -> dict[str, Any]:
        """Make the champion before the current one champion again (from the audit log)."""
        current = self.aliases(kind).get("champion")
        for entry in reversed(self.audit(kind)):
            if entry["alias"] == "champion" and entry["to"] == current and entry["from"] is not None:
                return self.set_alias(kind, "champion", entry["from"], actor=actor, reason=f"rollback: {reason}",
                                      evidence={"rolled_back": current})
        raise RegistryError(f"{kind}: no earlier champion to roll back to")

    @staticmethod
    def _load(path: Path) -> ModelVersion:
        meta = json.loads((path / METADATA_FILE).read_text(encoding="utf-8"))
        return ModelVersion(
            kind=meta["kind"],
            version=int(meta["version"]),
            path=path,
            created_at=meta["created_at"],
            config=meta.get("config", {}),
            metrics=meta.get("metrics", {}),
            privacy=meta.get("privacy", {}),
            extra=meta.get("extra", {}),
        )

    @contextmanager
    def publish(
        self,
        kind: str,
        *,
        config: dict[str, Any],
        metrics: dict[str, Any] | None = None,
        privacy: dict[str, Any] | None = None,
        extra: dict[str, Any] | None = None,
        card: str | None = None,
    ) -> Iterator[Path]:
        """Stage a new version: write artifact files into the yielded folder.

        On normal exit the metadata and model card are written and the folder is
        atomically renamed to the next version number; on an exception nothing is
        published. ``metrics`` may be updated in place inside the block.
        """
        kind_dir = self._kind_dir(kind)
        kind_dir.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=kind_dir))
        metrics = {} if metrics is None else metrics
        try:
            yield staging
            # a concurrent publisher that took the next number makes the rename fail: take the one after it
            for attempt in retrying(_taken, attempts=100):
                with attempt:
                    latest = self.latest(kind)
                    number = (latest.version if latest else 0) + 1
                    meta = {
                        "kind": kind,
                        "version": number,
                        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
                        "config": _jsonable(config),
                        "metrics": _jsonable(metrics),
                        "privacy": _jsonable(privacy or {}),
                        "extra": _jsonable(extra or {}),
                        "files": sorted(p.name for p in staging.iterdir() if p.name not in (METADATA_FILE, CARD_FILE)),
                    }
                    (staging / METADATA_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True), encoding="utf-8")
                    (staging / CARD_FILE).write_text(_render_card(meta, card), encoding="utf-8")
                    os.rename(staging, kind_dir / f"v{number:04d}")
            log.info("registry published kind=%s version=%d path=%s", kind, number, kind_dir)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
