"""Scheduling policies that turn jobs and cluster resources into cache and remote IO allocations."""
