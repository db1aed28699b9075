"""An example of a position encoding that lives outside posbench (see posbench's docs/extending.md)."""
