"""Experiment configuration, run folders, manifests, atomic file writes and the corpus file format shared by
every stage."""
