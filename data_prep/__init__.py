"""Data preparation: corpus building (recipe 1) and tokenized TFRecord shards (recipe 3)."""
