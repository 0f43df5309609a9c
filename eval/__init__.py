"""Recipe 05: Russian evaluation (bits per byte, a task harness, Hugging Face export)."""
