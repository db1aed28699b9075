"""Additions to posbench that live outside it: an encoding, a task and a probe (posbench's docs/extending.md)."""
