"""Experiment tracking: the logger config group, and what an offline wandb run holds, read back
from its transaction log (``run-<id>.wandb``) with wandb's own protobuf messages."""

import json
import struct
import time

import pandas as pd
import pytest

from conftest import SMOKE, compose, posbench
from posbench.runs.rundir import RunDir
from posbench.config import config_hash
from posbench.train.logger import MetricsLogger


@pytest.fixture
def wandb_env(tmp_path, monkeypatch):
    """wandb offline with every directory it may write under tmp_path (HOME included), no
    credentials, no system-metrics sampler, and an unreachable server should anything try."""
    home = tmp_path / "home"
    home.mkdir()
    for key in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_PROJECT", "WANDB_ENTITY", "WANDB_RUN_ID", "WANDB_DIR"):
        monkeypatch.delenv(key, raising=False)
    env = {"HOME": home, "WANDB_CONFIG_DIR": tmp_path / "wandb_config", "WANDB_CACHE_DIR": tmp_path / "wandb_cache",
           "WANDB_DATA_DIR": tmp_path / "wandb_data", "WANDB_ARTIFACT_DIR": tmp_path / "wandb_artifacts",
           "MPLCONFIGDIR": tmp_path / "mpl", "WANDB_SILENT": "true", "WANDB_DISABLE_CODE": "true",
           "WANDB_DISABLE_GIT": "true", "WANDB_X_DISABLE_STATS": "true", "WANDB_BASE_URL": "http://127.0.0.1:9"}
    for key, value in env.items():
        monkeypatch.setenv(key, str(value))
    yield home
    import wandb

    wandb.teardown()  # stops the in-process service, if a test started one
    assert [p for p in home.rglob("*") if "wandb" in str(p).lower()] == []


def _records(data: bytes) -> list:
    """The ``Record`` protobufs of a .wandb file's bytes (see :func:`read_offline_run`)."""
    from wandb.proto import wandb_internal_pb2 as pb

    assert data[:4] == b":W&B"
    block, i, chunk, records = 32768, 7, b"", []
    while i + 7 <= len(data):
        left = block - i % block
        if left < 7:
            i += left
            continue
        _, length, kind = struct.unpack("<IHB", data[i:i + 7])
        if kind == 0:  # zero padding to the end of the block
            i += left
            continue
        if i + 7 + length > len(data):  # a record still being written
            break
        chunk += data[i + 7:i + 7 + length]
        i += 7 + length
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(chunk)
            records.append(record)
            chunk = b""
    return records


def read_offline_run(run_dir):
    """-> (config, history rows, summary, run record, files dir) of the one offline wandb run under
    ``run_dir``. The .wandb file is a LevelDB-style log: a 7-byte file header, then 32 KiB
    blocks of records, each a 7-byte header (crc32, length uint16, type: 1 full, 2 first, 3 middle,
    4 last) and a chunk of one serialized ``Record`` protobuf."""
    (path,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    deadline = time.monotonic() + 60
    while True:  # wandb's service process may still be writing the file when finish() returns: read to its exit record
        records = _records(path.read_bytes())
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            break
        time.sleep(0.2)

    def key(item):
        return "/".join(item.nested_key) if item.nested_key else item.key

    config, history, summary, run = {}, [], {}, None
    for r in records:
        kind = r.WhichOneof("record_type")
        if kind == "run":
            run = r.run
            config.update({key(u): json.loads(u.value_json) for u in r.run.config.update})
        elif kind == "history":
            history.append({key(item): json.loads(item.value_json) for item in r.history.item})
        elif kind == "summary":
            summary.update({key(u): json.loads(u.value_json) for u in r.summary.update})
    return config, history, summary, run, path.parent / "files"


def logged_table(history, files, name) -> pd.DataFrame:
    (row,) = [h for h in history if f"{name}/path" in h]
    table = json.loads((files / row[f"{name}/path"]).read_text())
    return pd.DataFrame(table["data"], columns=table["columns"])


def test_logger_group_sets_the_wandb_mode_and_not_the_config_hash():
    assert compose().wandb.mode == "disabled"  # logger=none, the default
    assert compose("logger=wandb").wandb.mode == "offline"
    assert compose("logger=wandb", "wandb.mode=online").wandb.mode == "online"
    assert compose("logger=wandb").wandb.project == "posbench"
    assert config_hash(compose("logger=wandb")) == config_hash(compose())
    proc = posbench("train", "logger=neptune", check=False)
    assert proc.returncode == 2 and "unknown logger 'neptune'; valid choices: none, wandb" in proc.stderr


def results_rows():
    return pd.DataFrame({
        "encoding": "rope", "rope_scaling": ["none", "none", "yarn"], "train_len": 32, "eval_len": [32, 64, 64],
        "seed": 0, "split": "validation", "mode": "nonoverlapping", "stride": [32, 64, 64], "rope_factor": [1.0, 1.0, 2.0],
        "ppl": [50.0, 61.5, 55.25], "nll": [3.91, 4.12, 4.01], "bpb": [1.25, 1.5, 1.375], "word_ppl": [200.0, 260.0, 230.0],
        "tokens": 2048, "bytes": 8000, "words": 1500, "status": "ok", "model": "tiny", "data": "sotu", "steps": 10,
        "config_hash": "abc", "code_version": "0.1.0"})


def test_finish_logs_results_positions_and_summary(tmp_path, wandb_env):
    cfg = compose(*SMOKE, "encoding=rope", "logger=wandb")
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    logger = MetricsLogger(run, cfg)
    for step, loss in ((5, 6.5), (10, 6.0)):
        logger.log({"step": step, "loss": loss, "lr": 1e-3, "tokens_per_s": 900.0})
    positions = pd.DataFrame({"encoding": "rope", "rope_scaling": "none", "train_len": 32, "eval_len": 64,
                              "seed": 0, "split": "validation", "mode": "nonoverlapping", "stride": 64,
                              "bin_start": [0, 32], "bin_end": [31, 63], "nll": [4.5, 4.25], "tokens": 1024,
                              "config_hash": "abc", "code_version": "0.1.0"})
    positions.to_csv(run.path / "positions.csv", index=False)
    logger.finish(results_rows())

    config, history, summary, record, files = read_offline_run(run.path)
    assert config["train"]["steps"] == 30 and config["encoding"]["name"] == "rope" and config["seed"] == 0
    assert record.run_group == config_hash(cfg) and record.display_name == "run"
    assert [(h["_step"], h["train/loss"]) for h in history if "train/loss" in h] == [(5, 6.5), (10, 6.0)]
    table = logged_table(history, files, "eval/results")
    assert table.ppl.tolist() == [50.0, 61.5, 55.25] and table.bpb.tolist() == [1.25, 1.5, 1.375]
    assert logged_table(history, files, "eval/positions").nll.tolist() == [4.5, 4.25]
    assert not [h for h in history if "eval/passkey/path" in h]  # no passkey.csv, no table
    chart = logged_table(history, files, "eval/ppl_vs_length_table")
    assert sorted(zip(chart.label, chart.eval_len, chart.ppl)) == [("rope", 32, 50.0), ("rope", 64, 61.5),
                                                                   ("rope+yarn", 64, 55.25)]
    assert summary["eval/rope/bpb@64"] == 1.5 and summary["eval/rope+yarn/ppl@64"] == 55.25


@pytest.mark.slow
def test_train_with_logger_wandb_records_config_curves_and_results(tmp_path, wandb_env):
    run = tmp_path / "run"
    posbench("train", *SMOKE, "encoding=alibi", "logger=wandb", "train.steps=20", f"hydra.run.dir={run}")
    config, history, summary, record, files = read_offline_run(run)
    assert config["train"]["steps"] == 20 and config["encoding"]["name"] == "alibi"
    assert config["wandb"]["mode"] == "offline" and config["data"]["max_docs"] == 24
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    curve = {h["_step"]: h for h in history if "train/loss" in h}
    assert sorted(curve) == [m["step"] for m in metrics] == [5, 10, 15, 20]
    assert [curve[m["step"]]["train/loss"] for m in metrics] == pytest.approx([m["loss"] for m in metrics])
    assert [curve[m["step"]]["train/lr"] for m in metrics] == pytest.approx([m["lr"] for m in metrics])
    results = pd.read_csv(run / "results.csv")
    table = logged_table(history, files, "eval/results")
    assert table.eval_len.tolist() == results.eval_len.tolist() == [32, 64, 128, 256, 512]
    assert table.ppl.tolist() == pytest.approx(results.ppl.tolist())
    assert summary["eval/alibi/ppl@512"] == pytest.approx(results.ppl.iloc[-1])
    assert record.run_group == results.config_hash.iloc[0]
    logged = logged_table(history, files, "eval/positions")  # positions.csv: written by the evaluation
    assert logged.nll.tolist() == pytest.approx(pd.read_csv(run / "positions.csv").nll.tolist())
