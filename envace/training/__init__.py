"""Training: role-wise GRPO (`grpo.py`) on rows produced by the rollout engine."""
