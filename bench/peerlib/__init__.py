"""Side-by-side comparisons with other RL trainers (``bench/peers_trl.py``).

Pure helpers that import no peer library: :mod:`~peerlib.trl_args` translates a zbrl run
config into TRL ``GRPOConfig`` arguments (and lists what cannot be matched), and
:mod:`~peerlib.curves` turns accuracy-versus-training-time curves into the comparison table.
"""
