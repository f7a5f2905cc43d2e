"""Bundles: one read-only file holding many records and an index, a tier like any other."""
