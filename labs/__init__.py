"""The lessons: the guides (NN-*.md) and the code only they use, above the core (the root)."""
