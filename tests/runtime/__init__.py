"""Tests of stoker.runtime."""
