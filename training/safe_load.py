"""Loading ``torch.save`` files without running code from them: checkpoints and bank-data caches.

Why: a ``.pt`` file is a pickle, and ``torch.load(weights_only=False)`` runs whatever its ``__reduce__`` entries
name, so anyone who can write a checkpoint or cache folder (a shared registry, a bank's scratch disk) could run
code in the training job that resumes from it. :func:`load_torch_file` always loads with ``weights_only=True``
(tensors and plain Python values only) and allows, for that one call, just the few types a caller names, each a
plain data holder whose unpickling only sets attributes. A file that asks for anything else is refused with a
one-line :class:`UnsafeFileError` naming what it asked for; nothing from it runs.
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedfraud.core.errors import UserError

__all__ = ["NUMPY_ARRAYS", "UnsafeFileError", "load_torch_file"]

log = logging.getLogger(__name__)

#: What a pickled numpy array or scalar needs: the array and scalar constructors and the dtype classes. None of
#: them calls back into Python code chosen by the file: an object array's items go through the same restricted
#: unpickler.
NUMPY_ARRAYS: tuple[Callable[..., Any], ...] = (
    np._core.multiarray._reconstruct,  # the name numpy pickles arrays under
    np._core.multiarray.scalar,  # ... and scalars
    np.ndarray,
    np.dtype,
    *(getattr(np.dtypes, name) for name in dir(np.dtypes) if name.endswith("DType")),
)


class UnsafeFileError(UserError):
    """A ``torch.save`` file that needs more than tensors, plain values and the allowed types to load."""


def load_torch_file(path: Path | str, allowed: Sequence[Callable[..., Any]] = (), what: str = "file") -> Any:
    """``torch.load(path, weights_only=True)`` with ``allowed`` added to the safe types for this call only.

    Raises :class:`UnsafeFileError` (one line, naming the globals the file wanted) when the file holds anything
    else, e.g. a ``__reduce__`` that would call a function: it is never called. Other errors (a torn file) are
    raised as ``torch.load`` raises them.
    """
    path = Path(path)
    try:
        with torch.serialization.safe_globals(list(allowed)):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        try:
            wanted = sorted(set(torch.serialization.get_unsafe_globals_in_checkpoint(path)) - _names(allowed))
        except Exception:  # noqa: BLE001 - not even a readable archive: name the unpickler's first line instead
            wanted = []
        detail = ", ".join(wanted) if wanted else str(exc).strip().splitlines()[0][:200]
        raise UnsafeFileError(f"refusing to load {what} {path}: it holds more than tensors and plain values "
                              f"({detail}), and loading it could run code; delete it if you did not write it"
                              ) from None


def _names(allowed: Sequence[Callable[..., Any]]) -> set[str]:
    """``module.qualname`` of each allowed type, as :func:`torch.serialization.get_unsafe_globals_in_checkpoint`
    names globals.
    """
    return {f"{getattr(a, '__module__', '')}.{getattr(a, '__qualname__', getattr(a, '__name__', ''))}"
            for a in allowed}
