"""The scorer's L'/T' row table: a FIFO ring in one matrix (serving/anomaly_cache.py)."""

from __future__ import annotations

import numpy as np

from fedfraud.serving.anomaly_cache import FreshCache, _RowTable


def _row(i: int, dim: int = 4) -> np.ndarray:
    return np.full(dim, float(i), dtype=np.float32)


def test_rows_come_back_by_pair_and_misses_are_computed_once():
    table = _RowTable(capacity=8, dim=4)
    table.put([(1, 0.5), (2, 0.5)], np.stack([_row(1), _row(2)]))
    asked: list[list[int]] = []

    def compute(idx: np.ndarray) -> np.ndarray:
        asked.append(idx.tolist())
        return np.stack([_row(100 + int(i)) for i in idx])

    got = table.rows([(2, 0.5), (3, 0.5), (1, 0.5), (1, 1.0)], compute)
    assert asked == [[1, 3]]  # (3, 0.5) and (1, 1.0): same key, other budget, is another row
    np.testing.assert_array_equal(got, np.stack([_row(2), _row(101), _row(1), _row(103)]))
    again = table.rows([(3, 0.5), (1, 1.0)], compute)
    assert asked == [[1, 3]]  # now cached
    np.testing.assert_array_equal(again, np.stack([_row(101), _row(103)]))


def test_the_oldest_rows_are_evicted_first_and_the_matrix_grows_to_capacity():
    table = _RowTable(capacity=5000, dim=2)  # starts at 4,096 rows, grows once
    table.put([(i, 1.0) for i in range(6000)], np.repeat(np.arange(6000, dtype=np.float32)[:, None], 2, axis=1))
    assert len(table) == 5000
    misses: list[int] = []

    def compute(idx: np.ndarray) -> np.ndarray:
        misses.extend(idx.tolist())
        return np.full((len(idx), 2), -1.0, dtype=np.float32)

    got = table.rows([(999, 1.0), (1000, 1.0), (5999, 1.0)], compute)
    assert misses == [0]  # 0..999 were overwritten
    np.testing.assert_array_equal(got[:, 0], [-1.0, 1000.0, 5999.0])


def test_a_pair_stored_twice_keeps_its_newest_row_and_survives_its_old_slot_being_reused():
    table = _RowTable(capacity=3, dim=1)
    table.put([(7, 1.0)], np.array([[1.0]], dtype=np.float32))
    table.put([(7, 1.0)], np.array([[2.0]], dtype=np.float32))  # slot 1; slot 0 is stale
    table.put([(8, 1.0), (9, 1.0)], np.array([[8.0], [9.0]], dtype=np.float32))  # reuses slot 0
    assert len(table) == 3
    np.testing.assert_array_equal(table.rows([(7, 1.0), (8, 1.0), (9, 1.0)], None), [[2.0], [8.0], [9.0]])


def test_misses_never_evict_a_row_the_same_call_returns():
    table = _RowTable(capacity=2, dim=1)
    table.put([(1, 1.0), (2, 1.0)], np.array([[1.0], [2.0]], dtype=np.float32))
    got = table.rows([(1, 1.0), (3, 1.0), (4, 1.0)], lambda idx: np.array([[30.0], [40.0]], dtype=np.float32))
    np.testing.assert_array_equal(got, [[1.0], [30.0], [40.0]])
    assert len(table) == 2  # 3 and 4 evicted 1 and 2


def test_a_pair_missing_several_times_in_one_call_is_computed_and_stored_once():
    table = _RowTable(capacity=4, dim=1)
    asked: list[list[int]] = []

    def compute(idx: np.ndarray) -> np.ndarray:
        asked.append(idx.tolist())
        return np.asarray([[10.0 * i] for i in idx], dtype=np.float32)

    got = table.rows([(5, 1.0), (6, 1.0), (5, 1.0), (5, 1.0), (7, 1.0)], compute)
    assert asked == [[0, 1, 4]]
    np.testing.assert_array_equal(got, [[0.0], [10.0], [0.0], [0.0], [40.0]])
    assert len(table) == 3 and table._next == 3  # three slots used, not five


def test_a_kept_q_t_owns_its_memory_and_clear_forgets_it() -> None:
    """The challenger's q_t is a row of its batch's matrix: kept as a view, it would keep the whole matrix alive."""
    batch_q = np.arange(12, dtype=np.float32).reshape(3, 4)
    fresh = FreshCache(capacity=2)
    fresh.put("card-a", 1, "anomaly:v2", batch_q[1])
    kept = fresh.q("card-a", 1, "anomaly:v2")
    assert kept is not None and kept.base is None and np.array_equal(kept, batch_q[1])
    assert fresh.q("card-a", 2, "anomaly:v2") is None and fresh.q("card-a", 1, "anomaly:v3") is None
    fresh.clear()
    assert fresh.q("card-a", 1, "anomaly:v2") is None
