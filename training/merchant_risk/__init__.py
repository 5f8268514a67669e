"""Federated merchant risk: per-merchant label statistics each bank computes, summed across banks daily.

``stats``: the per-bank vector over a fixed public domain of keyed-merchant buckets, the per-cardholder bound,
the federation's release and the causal per-transaction features; ``backtest``: the time replay behind
``fedfraud eval backtest``; ``dp``: the banks' Skellam noise shares and the per-cardholder accountant; ``release``:
the private release (clip, noise share, SecAgg field; :func:`~.release.private_release` simulates it in process);
``release_app``: the same release as a Flower app under SecAgg+ (``apps/merchant_release``). The backtest still
sums in clear (:func:`~.stats.federation_release`) until it calls ``private_release``.
"""
