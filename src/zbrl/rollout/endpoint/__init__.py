"""An OpenAI-compatible endpoint that records tokens (docs/agents.md): agents talk to the policy
through ``/v1/chat/completions``, ``/v1/completions`` and ``/v1/models``; every call's prompt ids,
completion ids, log-probs and policy version are kept per episode, token-exact."""
