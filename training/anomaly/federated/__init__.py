"""The Flower app triad of this model: ``client_app``, ``server_app`` and ``task``."""
