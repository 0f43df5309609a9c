"""Weights & Biases tracking (one run per recipe invocation, offline when no API key is set) and the recipe harness."""
