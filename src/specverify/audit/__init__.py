"""Losslessness audit: exact laws (exact.py) held against what a verifier commits."""
