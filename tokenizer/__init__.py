"""Recipe 02: a Russian SentencePiece tokenizer, its report, baselines and Hugging Face export."""
