"""Dataset formats: one module per dataset's annotation files (``msrvtt``, ``msvd``, ``didemo``, ``activitynet``,
``generic``), each a registered :class:`~tvr.data.formats.base.DatasetFormat` (``registry.py``); the readers they share
are ``reading.py``. :mod:`tvr.data.annotations` turns what a format reads into train / val / test splits."""
