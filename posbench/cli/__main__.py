"""``python -m posbench.cli ...``: the same as the ``posbench`` console script."""

from . import main

if __name__ == "__main__":
    main()
