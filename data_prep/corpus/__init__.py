"""Recipe 01: read the sources, clean, deduplicate and write the corpus (``build.build_corpus``)."""
