"""RunConfig → the plain components a run is made of: datasets, rewards, models, backends, the
trainer and every role's settings. Nothing here imports Ray; ``zbrl.launch`` only turns these
components into actors, and ``zbrl eval`` and in-process tests use them directly.

A run is built once, in two halves: the pre-flight (``zbrl.launch.preflight``) opens what the run
reads (dataset files, model and tokenizer: :class:`~zbrl.assembly.artifacts.RunSources`) before
anything is created, and the build (:func:`~zbrl.assembly.artifacts.prepare_artifacts`, the
prompts' encoding) uses what it opened.

Modules: :mod:`~zbrl.assembly.embedded` (the embedded default from the config; the bottom of this
package), :mod:`~zbrl.assembly.model_source` (model and tokenizer opened),
:mod:`~zbrl.assembly.artifacts` (model directory and dataset references, the embedded default
included), :mod:`~zbrl.assembly.datasets` (dataset references opened, prompts encoded),
:mod:`~zbrl.assembly.rewards` (the reward function), :mod:`~zbrl.assembly.models` (policy,
tokenizer, inference backend, trainer), :mod:`~zbrl.assembly.input_checks` (packages; ``zbrl
eval``'s inputs) and :mod:`~zbrl.assembly.settings` (role settings).
"""
