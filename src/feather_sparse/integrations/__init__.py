"""Callbacks that run Feather inside training frameworks.

- :mod:`feather_sparse.integrations.hf` — ``FeatherCallback`` for the
  Hugging Face ``transformers.Trainer`` (install ``feather-sparse[hf]``).
- :mod:`feather_sparse.integrations.lightning` — ``FeatherCallback`` for
  Lightning's ``Trainer`` (install ``feather-sparse[lightning]``).

Both follow one contract: attach a :class:`~feather_sparse.Pruner` when
training starts, with the total number of optimizer steps taken from the
trainer; step it after every optimizer step (so gradient accumulation is
respected); save and restore its state with the trainer's checkpoints; log the
sparsity and threshold to the trainer's loggers; finalize at the end.

This package imports nothing: each submodule imports its framework only when
it is imported itself, so ``import feather_sparse`` never pulls in
``transformers`` or ``lightning``.
"""
