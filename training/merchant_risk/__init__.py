"""Federated merchant risk: per-merchant label statistics each bank computes, summed across banks daily.

``stats``: the per-bank vector over a fixed public domain of keyed-merchant buckets, the per-cardholder bound,
the federation's release and the causal per-transaction features; ``backtest``: the time replay behind
``fedfraud eval backtest``. DP noise and secure aggregation are not on yet (the release is a clear sum).
"""
