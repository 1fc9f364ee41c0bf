"""Training and evaluation data."""
