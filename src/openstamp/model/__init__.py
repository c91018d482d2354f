"""What both sides do with a causal language model: load it, read its hidden states, patch its head.

load.py         load a model and tokenizer (directory, hub id or packaged alias)
hidden.py       the decoder's final hidden states (what lm_head multiplies)
patch.py        write U~ = U + dW into the head (re-tied or untied), check a key, revert
text.py         tokenizer helpers: BOS, encoding, never-green tokens, token frequencies
generate.py     sampling continuations
perplexity.py   the model's own perplexity on human text: what a watermark costs
similarity.py   how close two matrices are, in one pass
"""
