"""A fifth method that lives outside the ``tvr`` package, as one folder: the walk-through of docs/architecture.md
("Add a method"). Its head and options (:mod:`.head`), its own loss (:mod:`.losses`, pure), its ``tvr analyze``
figure (:mod:`.figures`, named by the head's ``analysis_figures``) and its preset (``preset.yaml``). Used by import
path, ``head.name: toy_method:ToyHead`` (with ``tvr --trust-code``); ``tests/test_toy_method.py`` trains, evaluates
and analyses it through the CLI without a change to tvr."""

from toy_method.head import ToyHead, ToyOptions

__all__ = ["ToyHead", "ToyOptions"]
