"""Recipe 02: train the Russian SentencePiece tokenizer on the cleaned corpus (or, with tokenizer.adopt_from,
adopt a base model's tokenizer) and report on it."""

from experiment.stages import TOKENIZER
from tokenizer.train import train_tokenizer
from tracking.harness import recipe_main

if __name__ == "__main__":
    recipe_main(TOKENIZER, "Train the SentencePiece tokenizer (or adopt a base model's), its report and Hugging Face export", train_tokenizer)
