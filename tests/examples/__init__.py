"""Tests of the examples under examples/, mirroring its layout."""
