"""Data preparation, one subpackage per stage: corpus/ (recipe 01) and shards/ (recipe 03, with the loader)."""
