"""Developer tools that read the library and are not part of it (nothing in the library imports them)."""
