"""The package root nki-library installs (ours, for tests)."""
