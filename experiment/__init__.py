"""Experiment configuration, run folders, manifests and atomic file writes shared by every stage."""
