"""Local Ray as it ships (``plain``) or as zbrl tunes it (``fast``): the registry of every
replacement of a Ray internal (:mod:`.registry`), the replacements themselves
(:mod:`.replacements`), and the processes they start: the dashboard-agent stand-in
(:mod:`.agent_standin`), the raylet's worker program (:mod:`.worker_exec`) and the workers'
fork server (:mod:`.forkserver`). See docs/local-ray.md."""
