"""Small example graphs for lab 11 (the drill): each counts its own effects in a SQLite file."""
