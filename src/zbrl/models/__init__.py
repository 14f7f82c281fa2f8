"""Models as users name them: model sources (local directories, Hub ids, GGUF files, pulled
models; see :mod:`zbrl.models.sources`), chat templates, LoRA, the value model and the likelihood
verifier. The embedded default's tiny model and tokenizer live in :mod:`zbrl.embedded`.

The light modules of this package (sources, catalogue, the ``zbrl models`` command) load without
torch and transformers; import the others by their module path.
"""
