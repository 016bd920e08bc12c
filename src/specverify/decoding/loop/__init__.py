"""The decoding loops: the state both share (state), chains (chain: plain and speculative), trees (tree),
the one-time warm-up and what a generation reports (result)."""
