"""What ships with a release: the leak audit and the GGUF export."""
