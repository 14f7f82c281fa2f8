"""Agent episodes (``environment.type: agent``, docs/agents.md): a user's agent runs each episode
against the endpoint (:mod:`zbrl.rollout.endpoint`), and the episode runner trains the tokens the
endpoint recorded."""
