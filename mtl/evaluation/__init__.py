"""Evaluation: metrics, verification pairs and sets, and the per-task evaluator."""
