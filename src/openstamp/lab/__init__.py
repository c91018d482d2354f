"""The lab (``pip install 'openstamp[lab]'``): baselines, the evaluation harness, attacks and analyses.

The product (everything outside this package) never imports it. Its commands (eval, report, store,
merge-runs, attack, analyze) join the ``openstamp`` command through the ``openstamp.cli`` entry point.
"""
