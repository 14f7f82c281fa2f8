"""The transformers backend: ``model.generate`` on CPU or GPU (:mod:`.backend`), the rule for
where a response ends (:mod:`.responses`) and in-flight generation in chunks (:mod:`.inflight`)."""
