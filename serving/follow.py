"""Following registry names: the one "what moved?" question every hot-swapping deployment asks each poll.

The deployments differ in how they wait (the hot path polls in a thread between
micro-batches, the tokenizer service in an asyncio task) and in what a swap
installs, so each keeps its own loop; what they share is which followed names
now point at a version other than the one loaded. Comparing tags (not "newer
than") is what makes a rollback of ``champion`` swap back to the older model.
"""

from __future__ import annotations

from collections.abc import Mapping

from fedfraud.training.registry import ModelRegistry, ModelVersion

__all__ = ["FOLLOWED", "moved"]

#: Names a deployment follows; a pinned version (``v3``) is served as is.
FOLLOWED = ("champion", "latest")


def moved(registry: ModelRegistry, follow: Mapping[str, str], loaded: Mapping[str, str]) -> dict[str, ModelVersion]:
    """Per kind whose followed name (``follow[kind]``) points at a tag other than ``loaded[kind]``, that version.

    Kinds following a pinned version are skipped; a missing kind or name raises
    :class:`fedfraud.training.registry.RegistryError` (the caller keeps what it serves).
    """
    targets = {kind: registry.get(kind, name) for kind, name in follow.items() if name in FOLLOWED}
    return {kind: target for kind, target in targets.items() if target.tag != loaded[kind]}
