"""Method heads: each one scores (text, video) pairs and computes its training loss.

One folder per method (``clip4clip``, ``gare``, ``proxy``, ``gravialign``): its options and head, its exact scorers,
its own losses and its ``tvr analyze`` figures; ``base`` is the contract, ``common`` the helpers heads share,
``registry`` finds the heads. Use :func:`tvr.models.heads.registry.build_head` to build a head from a config.
"""
