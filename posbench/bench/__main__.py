"""``python -m posbench.bench``: the command, or one measurement (``--child SPEC``) in its own process."""

import json
import sys

from .children import _child, _kernel_child, _matmul_child, _trainer_child

if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        spec = json.loads(sys.argv[2])
        child = {"model": _child, "kernel": _kernel_child, "matmul": _matmul_child}[spec["what"]]
        if spec["what"] == "model" and spec.get("impl") == "posbench train":
            child = _trainer_child
        print(json.dumps(child(spec)), flush=True)
    else:
        from ..errors import PosbenchError, fail
        from .cli import main  # a child never imports the command's tables

        try:
            main()
        except PosbenchError as e:  # one line, as `posbench bench` prints it
            fail(str(e))
