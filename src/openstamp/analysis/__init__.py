"""The paper's analyses of how a key behaves, as functions with plots (``openstamp analyze``)."""
