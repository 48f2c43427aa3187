"""Backbones as registered folders: ``tvr/models/backbones/<name>/`` declares one backbone (its settings, its
preprocessing, its tokenizer, what decides its frozen features, what it provides, how it is built), registered
with :func:`~tvr.models.backbones.registry.register_backbone`; another package registers its own the same way or
through the ``tvr.backbones`` entry-point group. docs/architecture.md, "Add a backbone", walks through one."""
