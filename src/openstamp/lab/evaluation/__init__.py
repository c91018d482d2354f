"""Evaluation: metrics from score arrays, the comparison pipeline, and reports."""
