"""Recipe 02: train the Russian SentencePiece tokenizer on the cleaned corpus and report on it."""

from tokenizer.train import train_tokenizer
from tracking.harness import recipe_main

if __name__ == "__main__":
    recipe_main("tokenizer", "Train the SentencePiece tokenizer, its report and Hugging Face export", train_tokenizer)
