"""Flower app triad of the G-HIN2Vec federation (``task.py``, ``client_app.py``, ``server_app.py``)."""
