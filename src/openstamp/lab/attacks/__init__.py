"""Attacks on a finished evaluation run: paraphrasing, fine-tuning, quantization, a re-trained
lm_head, token edits, and the selector-inversion analysis (the paper's robustness section).

Each attack is a plain function ``run_<attack>(..., out, cfg)`` with a frozen config dataclass;
it writes results.json, a Markdown section and plots to ``out`` and adds the section to the
evaluation's report (``<eval>/attacks/``).
"""
