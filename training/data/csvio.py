"""Chunked, byte-faithful CSV reading shared by the Sparkov and TabFormer loaders.

Why not a plain ``pd.read_csv``: the files are multi-GB, so they are streamed
in chunks with a progress bar; every value stays text (``dtype=object``, no
NA guessing) and undecodable bytes survive as lone surrogates, so the
canonical :class:`~fedfraud.feature_store.schema.Validator` - not pandas - decides
what is bad. This module never drops or judges a row.
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from fedfraud.core.errors import UserError

__all__ = ["REGION_HINT", "CsvHeader", "RawChunk", "iter_csv", "read_header"]

logger = logging.getLogger(__name__)

_INDEX_NAME = "_index"

#: Column a loader adds next to the canonical ones: the cardholder's home US
#: state, used by region partitioning and never written to the canonical file.
REGION_HINT = "home_state"


@dataclass(frozen=True)
class CsvHeader:
    """The delimiter and column names sniffed from a file's first line."""

    path: Path
    delimiter: str
    columns: tuple[str, ...]

    def __post_init__(self) -> None:
        if self.delimiter not in {",", "|"}:
            raise ValueError(f"unsupported delimiter {self.delimiter!r}")
        if not self.columns:
            raise ValueError("a CSV header needs at least one column")


@dataclass(frozen=True)
class RawChunk:
    """One chunk of records and their 0-based data-row numbers (header excluded).

    ``rows`` lets rejects be traced back to the file: for one-line records,
    file line = row + 2.
    """

    frame: pd.DataFrame
    rows: np.ndarray

    def __post_init__(self) -> None:
        if len(self.frame) != len(self.rows):
            raise ValueError("RawChunk.rows must have one entry per frame row")


def _text_stream(raw: BinaryIO) -> BinaryIO:
    """``raw`` itself, or a gzip reader over it when the file starts with the gzip magic bytes."""
    magic = raw.read(2)
    raw.seek(0)
    if magic == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    return contextlib.nullcontext(raw)  # type: ignore[return-value]


def read_header(path: Path) -> CsvHeader:
    """Sniff delimiter (``|`` or ``,``) and column names from the first line of ``path``."""
    path = Path(path)
    with path.open("rb") as raw, _text_stream(raw) as fh:
        try:
            first = fh.readline(1 << 20)
        except (OSError, EOFError) as exc:  # a truncated or corrupt .gz
            raise UserError(f"{path}: cannot read: {exc}") from None
    line = first.decode("utf-8", errors="surrogateescape").lstrip("\ufeff").rstrip("\r\n")
    if not line.strip():
        raise UserError(f"{path}: first line is empty, expected a CSV header")
    delimiter = "|" if line.count("|") > line.count(",") else ","
    names = next(csv.reader([line], delimiter=delimiter))
    columns = tuple(name.strip() or (_INDEX_NAME if i == 0 else f"_unnamed_{i}") for i, name in enumerate(names))
    return CsvHeader(path=path, delimiter=delimiter, columns=columns)


def iter_csv(
    header: CsvHeader,
    chunk_rows: int,
    usecols: Sequence[str] | None = None,
    desc: str | None = None,
    progress: bool = True,
) -> Iterator[RawChunk]:
    """Stream ``header.path`` as text chunks of at most ``chunk_rows`` records.

    ``usecols`` restricts the columns materialised: text objects are the
    dominant parse cost (about 2.5x for Sparkov), so loaders name what they
    map. The progress bar counts bytes, so it is exact for any file size
    without a pre-count of lines.

    Field-count errors: pandas' C parser pads a short line with "" (which
    validation reports as ``missing_field``) and, when ``usecols`` is given,
    reads a line with stray delimiters on its shifted values; a shifted
    Sparkov/TabFormer row puts text where an amount, coordinate or timestamp
    belongs, so validation rejects it. Rows are never dropped here.
    """
    wanted = list(header.columns) if usecols is None else list(dict.fromkeys(usecols))
    missing = [c for c in wanted if c not in header.columns]
    if missing:
        raise UserError(f"{header.path}: header lacks columns {missing}")
    size = header.path.stat().st_size
    next_row = 0
    with header.path.open("rb") as source, _text_stream(source) as fh, tqdm(
        total=size, unit="B", unit_scale=True, desc=desc or header.path.name, disable=not progress, leave=False
    ) as bar:
        reader = pd.read_csv(
            fh,
            sep=header.delimiter,
            names=list(header.columns),
            header=None,
            skiprows=1,
            usecols=wanted,
            dtype=object,
            keep_default_na=False,
            na_values=[],
            encoding="utf-8",
            encoding_errors="surrogateescape",
            chunksize=chunk_rows,
            engine="c",
            skip_blank_lines=True,
        )
        try:
            last = 0
            for raw in reader:
                rows = np.arange(next_row, next_row + len(raw), dtype=np.int64)
                next_row += len(raw)
                yield RawChunk(frame=raw.reset_index(drop=True), rows=rows)
                pos = source.tell()  # compressed bytes for a .gz: the bar still ends at the file size
                bar.update(max(pos - last, 0))
                last = pos
        except pd.errors.ParserError as exc:
            raise UserError(f"{header.path}: cannot parse CSV near data row {next_row}: {exc}") from None
        except (OSError, EOFError) as exc:  # gzip: a truncated or corrupt stream
            raise UserError(f"{header.path}: cannot read near data row {next_row}: {exc}") from None
        finally:
            reader.close()
