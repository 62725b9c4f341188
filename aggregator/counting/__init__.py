"""Counting: the mergeable per-cohort accumulators and the counts file."""
