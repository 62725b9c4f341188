"""Sealed reports on the aggregator's side: its HPKE key set (rotation) and batch opening."""
