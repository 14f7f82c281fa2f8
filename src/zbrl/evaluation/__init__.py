"""Evaluation on held-out sets (during training and for saved checkpoints)."""

from zbrl.evaluation.evaluator import EvalSet, Evaluator, evaluate_set, pass_at_k

__all__ = ["EvalSet", "Evaluator", "evaluate_set", "pass_at_k"]
