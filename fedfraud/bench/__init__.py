"""Benchmarks behind ``fedfraud bench``; each returns a dataclass that renders a markdown block."""
