"""Karios package."""
