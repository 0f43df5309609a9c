"""One module per config section; each stage's owner keeps its section's fields here."""
