"""The analyst's console (issue 40): a queue of decisions, a case view, label buttons and the models page.

``fedfraud console`` serves it (:mod:`fedfraud.cli.console`). The pieces, one home each:

* :mod:`fedfraud.console.index`: a background reader of ``fraud-decisions``, ``transactions`` and
  ``fraud-labels`` that keeps a compact row per record with its topic offset (what the queue filters and
  pages on), and reads a whole record back by its offset when a case is opened;
* :mod:`fedfraud.console.cases`: a case assembled from those records, the feature store's ego graph and
  merchant risk, drawn with networkx and matplotlib;
* :mod:`fedfraud.console.labels`: the "Fraud" / "Genuine" buttons, produced to ``fraud-labels`` as chargebacks
  are, and the audit log;
* :mod:`fedfraud.console.web`: the FastAPI app (Jinja2 templates, autoescaped; htmx vendored in ``static/``).
"""
