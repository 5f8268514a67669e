"""The bottom floor: helpers every other layer may import and that import nothing of the product.

``errors`` (the user-facing exceptions), ``logs``, ``net`` (loopback binds, free ports), ``tcpproxy``, ``pki`` and
``credentials``. Installed as ``fedfraud.core`` (setup.py's package map), so nothing generic lands in site-packages.
"""
