"""The vLLM backend: the in-process engine (:mod:`.backend`), its outputs as completions
(:mod:`.outputs`), in-flight generation by engine steps (:mod:`.inflight`) and LoRA adapters
(:mod:`.lora`). Nothing here imports vLLM at module level."""
