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


def moved(registry: ModelRegistry, follow: Mapping[str, str], loaded: Mapping[str, str],
          kinds: Mapping[str, str] | None = None) -> dict[str, ModelVersion]:
    """Per role whose followed name (``follow[role]``) points at a tag other than ``loaded[role]``, that version.

    A role is read from the registry kind of the same name, or from ``kinds[role]`` (a replica deciding with a
    GNN reads its ``fraud`` role from kind ``fraud-gnn``). Roles following a pinned version are skipped; a missing
    kind or name raises :class:`fedfraud.training.registry.RegistryError` (the caller keeps what it serves).
    """
    kinds = kinds or {}
    targets = {role: registry.get(kinds.get(role, role), name) for role, name in follow.items() if name in FOLLOWED}
    return {role: target for role, target in targets.items() if target.tag != loaded[role]}
