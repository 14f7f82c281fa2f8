"""The embedded default in one room (docs/embedded-default.md): what a run uses when no model hub
is reachable, exercising the code path a real model takes.

- :mod:`~zbrl.embedded.tokenizer` and :mod:`~zbrl.embedded.tiny_model`: a character-level
  tokenizer built with ``tokenizers`` and a tiny Llama built from a config, saved like a user's
  model;
- :mod:`~zbrl.embedded.addition_task` (the demo's task) and
  :mod:`~zbrl.embedded.multiplication_task` (the tool demo's): conversation JSONL with held-out
  splits;
- :mod:`~zbrl.embedded.warm_start` (the one warm-start builder),
  :mod:`~zbrl.embedded.warm_start_tasks` (each task as the builder sees it) and
  :mod:`~zbrl.embedded.probes` (quick accuracy checks);
- :mod:`~zbrl.embedded.reward_model` and :mod:`~zbrl.embedded.reward_model_data`: the reward
  model trained on the warm-started policy's answers;
- :mod:`~zbrl.embedded.artifacts`: each of these built once in a cache directory, then found.

Its floor: it builds on ``models``, ``data``, ``environments`` and ``rollout`` (the tool demo's
probe runs real episodes on the transformers backend) and on ``rewards`` (the reward model's
labels); it never imports ``config``, ``assembly``, ``launch`` or ``training``.
:mod:`zbrl.assembly.embedded` reads a RunConfig into its plain arguments.
"""
