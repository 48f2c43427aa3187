"""The retrieval methods, one folder each (``tvr/methods/<name>/``): the head and its options, its scorers, its pure
losses, its ``tvr analyze`` figures and, where it has one, the key map that imports its authors' release checkpoint.

The head registry (:mod:`tvr.models.heads.registry`) finds the folders without a list; the contract they implement
(:mod:`tvr.models.heads.base`) lives in the models layer below, and a method's figures use :mod:`tvr.analysis` and
:mod:`tvr.eval`, so this package sits above both (docs/architecture.md, "Layers")."""
