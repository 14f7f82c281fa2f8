"""RunConfig → the plain components a run is made of: datasets, rewards, models, backends, the
trainer and every role's settings. Nothing here imports Ray; ``zbrl.launch`` only turns these
components into actors, and ``zbrl eval`` and in-process tests use them directly.

Modules: :mod:`~zbrl.assembly.artifacts` (model directory and dataset files on disk, the embedded
default included), :mod:`~zbrl.assembly.datasets` (encoded prompts),
:mod:`~zbrl.assembly.rewards` (the reward function), :mod:`~zbrl.assembly.models` (policy,
tokenizer, inference backend, trainer) and :mod:`~zbrl.assembly.settings` (role settings).
"""
