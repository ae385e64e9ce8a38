"""A tiny package laid out like nki-library, written for these tests."""
