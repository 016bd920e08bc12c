"""What proposes drafts and how long they are: the drafter protocol (base), prompt lookup (ngram), a draft
model (model), draft trees (tree), and the draft-length policy with its measured costs (draft_length, cost_cache)."""
