"""Recipe 03: tokenize the corpus into TFRecord shards (``build.shard_corpus``) and the Grain loader that reads them."""
