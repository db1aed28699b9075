"""scripts/train_profile.py: the bench's training step under torch.profiler, kernel by kernel,
run here on the CPU eager (on a GPU it profiles the compiled step's kernels the same way)."""

import pandas as pd
from conftest import load_script


def test_profiles_each_encoding_and_compares_them_kernel_by_kernel(tmp_path):
    out = tmp_path / "profile"
    code = load_script("train_profile").main(["--device", "cpu", "--no-compile", "--model", "tiny", "--train-len",
                                              "16", "--tokens", "64", "--steps", "1", "--warmup", "0", "--encodings",
                                              "nope", "rope", "--out", str(out)])
    assert code == 0
    kernels = pd.read_csv(out / "kernels.csv")
    assert set(kernels.encoding) == {"nope", "rope"} and (kernels.ms_a_step > 0).all()
    assert "aten::mm" in set(kernels[kernels.encoding == "rope"].kernel)  # the projections' matmuls, seen
    # the rotation's own operators: rope multiplies more than nope in the same step
    mul = kernels[kernels.kernel == "aten::mul"].set_index("encoding").calls_a_step
    assert mul["rope"] > mul["nope"]
    text = (out / "compare.md").read_text()
    assert "--encodings nope rope" in text and text.split("## rope against nope")[1].count("\n| `") == 15
    assert "Self CPU" in (out / "rope.txt").read_text()  # the profiler's own table


def test_a_failing_step_keeps_its_whole_traceback_and_the_others_are_written(tmp_path):
    out = tmp_path / "profile"
    code = load_script("train_profile").main(["--device", "cpu", "--no-compile", "--model", "tiny", "--train-len",
                                              "16", "--tokens", "64", "--steps", "1", "--warmup", "0", "--encodings",
                                              "nope", "rope+model.n_heads=3", "--out", str(out)])
    assert code == 1
    error = (out / "rope+model.n_heads=3.error.txt").read_text()
    assert error.startswith("Traceback (most recent call last)") and "n_heads" in error
    assert set(pd.read_csv(out / "kernels.csv").encoding) == {"nope"}
