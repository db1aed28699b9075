"""Algorithmic tasks: instances against independent answers, answer-only loss, accuracy and its
interval, and training end to end (tasks.csv, resume)."""


import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from conftest import compose, posbench

from posbench.config import TaskConfig, conf_dir, config_hash, task_config
from posbench.data.tasks import BOS, EOS, IGNORE, SEP, SPECIALS, TASKS, Task, encode, make_task
from posbench.errors import PosbenchError
from posbench.eval.results import TASK_COLUMNS
from posbench.eval.tasks import markdown_tasks, score_size, size_row
from posbench.intervals import wilson_interval

TINY_TASK = ["model=task", "model.d_model=32", "model.n_heads=2", "model.d_ff=64", "model.n_layers=1",
             "train.batch_size=8", "train.warmup_steps=2", "train.log_every=5", "task.train_size=4",
             "task.eval_instances=12", "task.eval_batch=5", "device=cpu"]


def symbols(task, ids):
    return [i - len(SPECIALS) for i in ids]


def digits_value(digits, base):  # least significant first
    return sum(d * base ** i for i, d in enumerate(digits))


@pytest.mark.parametrize("size", [1, 3, 9])
def test_answers_match_an_independent_computation(size):
    g = torch.Generator().manual_seed(size)
    for name in sorted(TASKS.builtins):
        task = make_task(TaskConfig(name=name, symbols=7))
        for _ in range(20):
            prompt, answer = task.instance(g, size)
            p, a = symbols(task, prompt), symbols(task, answer)
            assert len(prompt) + len(answer) + 3 == task.length(size)
            assert all(0 <= t < task.n_symbols for t in p + a)
            if name == "copy":
                assert a == p
            elif name == "reverse":
                assert a == p[::-1]
            elif name == "duplicate":
                assert a == p + p
            elif name == "sort":
                assert a == sorted(p) and len(a) == size
            elif name == "addition":
                plus = p.index(7)  # "+" is the symbol after the digits
                x, y = p[:plus], p[plus + 1:]
                assert len(x) == len(y) == size and len(a) == size + 1
                assert digits_value(a, 7) == digits_value(x, 7) + digits_value(y, 7)
            elif name == "parity":
                assert set(p) <= {0, 1} and a == [sum(p) % 2]
            elif name == "recall":
                keys, values, query = p[0:-1:2], p[1:-1:2], p[-1]
                assert len(keys) == size and query in keys and all(k < 7 <= v for k, v in zip(keys, values))
                last = max(i for i, k in enumerate(keys) if k == query)
                assert a == [values[last]]
            elif name == "track":  # follow the assignments from the asked value, hop by hop
                pairs, query = list(zip(p[0:-1:2], p[1:-1:2])), p[-1]
                assert len(pairs) == 5 * size and query < 7 and all(lhs >= 7 for lhs, _ in pairs)
                chain, holder = [], query
                while True:
                    found = [lhs for lhs, rhs in pairs if rhs == holder]
                    if not found:
                        break
                    assert len(found) == 1  # the asked value and each variable are assigned once
                    chain.append(found[0])
                    holder = found[0]
                assert a == chain and len(set(lhs for lhs, _ in pairs)) == len(pairs)


def test_every_task_yaml_names_a_registered_task_and_every_built_in_has_one():
    yaml = {p.stem for p in (conf_dir() / "task").glob("*.yaml")}
    assert yaml == {"lm", *TASKS.builtins} and set(TASKS.builtins) <= set(TASKS.members)


def test_the_task_registry_refuses_unknown_names_and_options_in_one_line():
    with pytest.raises(PosbenchError, match=r"^unknown task 'nosuch'; valid choices: addition, copy, "):
        make_task(TaskConfig(name="nosuch"))
    with pytest.raises(PosbenchError, match=r"^task.width is not an option of task 'copy'; valid: .*train_size"):
        make_task(task_config({"name": "copy", "width": 3}))
    with pytest.raises(PosbenchError, match=r"^task.width is not an option of task=lm"):
        task_config({"name": "lm", "width": 3})
    with pytest.raises(PosbenchError, match=r"task.symbols=1 is the base of addition; valid: >= 2"):
        make_task(TaskConfig(name="addition", symbols=1))
    with pytest.raises(PosbenchError, match=r"^task.hops=0 is not valid for track; valid: >= 1"):
        make_task(task_config({"name": "track", "hops": 0}))
    track = make_task(task_config({"name": "track", "variables": 12}))
    with pytest.raises(PosbenchError, match=r"^task=track at size 3 needs 15 different variables; task.variables=12; "
                                            r"valid: task.variables >= 15"):
        track.instance(torch.Generator().manual_seed(0), 3)


class Increment(Task):
    """A task defined outside the package: n digits, then the number plus ``step``."""

    paper = "test"

    def __init__(self, symbols: int, step: int = 1):
        super().__init__(symbols)
        self.step = step

    def instance(self, generator, size):
        digits = torch.randint(0, self.symbols, (size,), generator=generator).tolist()
        value = sum(d * self.symbols ** i for i, d in enumerate(digits)) + self.step
        out = [(value // self.symbols ** i) % self.symbols for i in range(size + 1)]
        return self.sym(digits), self.sym(out)

    def answer_len(self, size):
        return size + 1


def test_a_target_task_registers_under_its_name_with_its_own_options_and_its_import_path_is_not_hashed():
    tc = task_config({"name": "increment", "_target_": f"{__name__}.Increment", "_package_": None, "step": 3,
                      "train_size": 4})
    task = make_task(tc)
    assert isinstance(task, Increment) and task.step == 3 and TASKS.members["increment"] is Increment
    assert TASKS.provenance("increment")["class"] == f"{__name__}.Increment"
    prompt, answer = task.instance(torch.Generator().manual_seed(0), 2)
    digits = [t - len(SPECIALS) for t in prompt]
    assert [t - len(SPECIALS) for t in answer] == [((digits[0] + 10 * digits[1] + 3) // 10 ** i) % 10 for i in range(3)]
    with pytest.raises(PosbenchError, match=r"^task plugin 'copy' .* has the name of the built-in task 'copy'"):
        make_task(task_config({"name": "copy", "_target_": f"{__name__}.Increment"}))
    base = compose("task=copy")
    with_target = compose("task=copy", "+task._target_=posbench.data.tasks.Copy", "+task._package_=x")
    assert config_hash(with_target) == config_hash(base)


def test_encode_targets_are_the_answer_and_eos_only():
    task = make_task(TaskConfig(name="reverse"))
    x, y = encode(task, torch.Generator().manual_seed(0), [2, 5])
    assert x.shape == y.shape == (2, task.length(5) - 1)
    for row, size in enumerate([2, 5]):
        seq = x[row, :task.length(size) - 1].tolist()
        assert seq[0] == BOS and seq[size + 1] == SEP
        scored = (y[row] != IGNORE).nonzero().flatten().tolist()
        assert scored == list(range(size + 1, 2 * size + 2))  # from <sep> on: answer tokens, then <eos>
        answer = y[row, scored].tolist()
        assert answer[-1] == EOS and answer[:-1] == seq[1:size + 1][::-1]
        assert all(y[row, t] == x[row, t + 1] for t in scored[:-1])  # next-token targets


def test_loss_is_the_mean_over_answer_tokens():
    from posbench.model.build import build_model

    cfg = compose("task=copy", *TINY_TASK)
    task = make_task(TaskConfig(name="copy", train_size=4))
    torch.manual_seed(0)
    model = build_model(cfg, task.vocab_size)
    x, y = encode(task, torch.Generator().manual_seed(1), [1, 4, 3])
    logits = model(x)
    keep = y != IGNORE
    expected = F.cross_entropy(logits[keep], y[keep])
    assert torch.allclose(model(x, targets=y), expected, rtol=1e-5)


def test_size_row_intervals():
    exact = torch.tensor([1, 1, 0, 1]).bool().numpy()
    token = torch.tensor([1.0, 1.0, 0.5, 1.0]).numpy()
    row = size_row(exact, token)
    assert row["exact_match"] == 0.75 and (row["exact_lo"], row["exact_hi"]) == pytest.approx(wilson_interval(3, 4)[1:3])
    sd = token.std(ddof=1)
    half = 3.182446305284263 * sd / 2  # t(0.975, df=3) * sd / sqrt(4)
    assert row["token_sd"] == pytest.approx(sd)
    assert row["token_lo"] == pytest.approx(0.875 - half) and row["token_hi"] == 1.0  # clipped at 1


def test_a_run_that_has_not_learned_its_task_says_so_under_its_table():
    def rows(exact_at_1x):
        return pd.DataFrame([{"task": "copy", "encoding": "nope", "eval_size": 8 * m, "multiple": m, "instances": 256,
                              **size_row(torch.arange(256).numpy() < round(256 * e), torch.full((256,), e).numpy())}
                             for m, e in [(1, exact_at_1x), (2, 0.0)]])

    learned, unlearned = markdown_tasks(rows(0.5)), markdown_tasks(rows(0.25))
    assert "note:" not in learned and learned.count("\n") == 3  # header, rule, two rows
    assert unlearned.splitlines()[2].startswith("| copy | nope | 8 | 1x | 25.0% [") and unlearned.splitlines()[4] == ""
    assert unlearned.splitlines()[-1] == (
        "note: exact match at the training size (copy, n=8) is 25.0%, below 50%: the model has not learned the "
        "task, so accuracy at longer sizes says little about length generalization; train longer (train.steps) "
        "or start from experiment=tasks_quick")


def test_exact_match_equals_greedy_decoding():
    """Teacher-forced: every answer token's arg-max right <=> greedy decoding after <sep> gives the answer."""
    from posbench.model.build import build_model

    cfg = compose("task=copy", *TINY_TASK)
    tcfg = TaskConfig(name="copy", train_size=4, eval_instances=40, eval_batch=40)
    task = make_task(tcfg)
    torch.manual_seed(3)
    model = build_model(cfg, task.vocab_size)
    with torch.no_grad():  # size 1 with 10 symbols: an untrained model gets some instances right by chance
        exact, _ = score_size(model, task, tcfg, 1, torch.device("cpu"), None)
        g = torch.Generator().manual_seed(tcfg.eval_seed * 1_000_003 + 1)
        x, y = encode(task, g, [1] * 40)
        greedy = []
        for row in range(40):
            seq = x[row, :3].tolist()  # <bos> s <sep>
            for _ in range(2):  # one answer token and <eos>
                seq.append(int(model(torch.tensor([seq]))[0, -1].argmax()))
            greedy.append(seq[3:] == y[row, 2:4].tolist())
    assert exact.tolist() == greedy


def test_lm_config_hash_unchanged_by_the_task_and_random_positions_keys():
    cfg = compose("encoding=alibi")
    with_keys = config_hash(cfg)
    from omegaconf import open_dict

    with open_dict(cfg):
        del cfg["task"]
        del cfg.train["random_positions"]
    assert config_hash(cfg) == with_keys
    assert config_hash(compose("task=copy")) != with_keys
    assert config_hash(compose("task=copy", "task.eval_instances=7")) == config_hash(compose("task=copy"))


def test_bad_task_settings_are_one_line_errors():
    with pytest.raises(PosbenchError, match="task.train_size must be > 0, got 0"):
        TaskConfig(name="copy", train_size=0)
    with pytest.raises(PosbenchError, match=r"task.eval_multiples=\[\] must be a non-empty list"):
        TaskConfig(name="copy", eval_multiples=[])
    proc = posbench("train", "task=nosuch", check=False)
    assert proc.returncode == 2 and "nosuch" in proc.stderr and "copy" in proc.stderr


@pytest.mark.parametrize("random_positions", [None, 96])
def test_task_run_writes_tasks_csv_and_resumes_identically(tmp_path, monkeypatch, random_positions):
    """A task run killed right after its step-5 checkpoint resumes to the same weights and accuracies
    (with randomized positions too: their draws are part of the sampler's saved state)."""
    import posbench.train.loop as train_module
    from posbench.train.configure import train_config

    extra = [] if random_positions is None else [f"train.random_positions={random_positions}"]
    cfg = compose("task=reverse", "encoding=rope", *TINY_TASK, "train.steps=10", "train.ckpt_every=5", *extra)
    full = train_module.train(train_config(cfg), tmp_path / "full")
    real_save = train_module.save_checkpoint

    def save_then_crash(path, state):
        real_save(path, state)
        if state["step"] == 5:
            raise KeyboardInterrupt

    monkeypatch.setattr(train_module, "save_checkpoint", save_then_crash)
    with pytest.raises(KeyboardInterrupt):
        train_module.train(train_config(cfg), tmp_path / "resumed")
    monkeypatch.setattr(train_module, "save_checkpoint", real_save)
    resumed = train_module.train(train_config(cfg), tmp_path / "resumed")

    a = torch.load(tmp_path / "full/checkpoints/last.pt", weights_only=False)["model"]
    b = torch.load(tmp_path / "resumed/checkpoints/last.pt", weights_only=False)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    rows = pd.read_csv(tmp_path / "full" / "tasks.csv")
    assert list(rows.columns) == TASK_COLUMNS
    assert rows.eval_size.tolist() == [4, 8, 16, 32] and rows.multiple.tolist() == [1, 2, 4, 8]
    assert (rows.instances == 12).all() and (rows.task == "reverse").all() and (rows.train_size == 4).all()
    assert ((rows.exact_lo <= rows.exact_match) & (rows.exact_match <= rows.exact_hi)).all()
    assert full.rows.token_acc.tolist() == resumed.rows.token_acc.tolist()
    assert pd.read_csv(tmp_path / "resumed" / "tasks.csv").token_acc.tolist() == rows.token_acc.tolist()
    assert full.rows.step.tolist() == [10] * 4
    assert (tmp_path / "full" / "config.yaml").read_text().count("train_len: 11") == 1  # 4 + 4 + 3 tokens
    assert (rows.random_positions == (random_positions or 0)).all()


def test_a_finished_task_run_evaluates_again_and_posbench_eval_refuses_it(tmp_path):
    run = tmp_path / "run"
    common = ["train", "task=parity", "encoding=nope", *TINY_TASK, "train.steps=3", f"hydra.run.dir={run}"]
    posbench(*common)
    checkpoint = run / "checkpoints" / "last.pt"
    before = checkpoint.stat().st_mtime_ns
    posbench(*common, "task.eval_multiples=[1,2]", "task.eval_instances=7")  # same config hash: no retraining
    rows = pd.read_csv(run / "tasks.csv")
    assert rows.multiple.tolist() == [1, 2] and (rows.instances == 7).all()
    assert checkpoint.stat().st_mtime_ns == before
    proc = posbench("eval", f"checkpoint={run}", check=False)
    assert proc.returncode == 2 and "is a task run (task=parity)" in proc.stderr and "Traceback" not in proc.stderr


def test_a_size_the_task_cannot_make_is_refused_before_training(tmp_path):
    """task=track at 8x its training size needs more variables than it has: one line, no run dir."""
    proc = posbench("train", "task=track", "task.train_size=2", "task.variables=30", "device=cpu",
                    f"hydra.run.dir={tmp_path / 'run'}", check=False)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1] == (
        "posbench: error: task=track at size 16 needs 80 different variables; task.variables=30; valid: "
        "task.variables >= 80 (size x (hops + 1))")
    assert not (tmp_path / "run").exists()
