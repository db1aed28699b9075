"""``posbench study NAME``: a study is data, a YAML file; this module trains what it lacks and reports.

A study file (``conf/study/<name>.yaml``, or a user's own through ``--config-dir DIR``) says::

    description: one line
    out: outputs/study/scale          # where its runs train (run dirs)
    runs: results/scale/runs          # where finished runs are exported (per-block NLL sums, a
                                      # few KiB each: what the report needs, small enough to commit)
    results: results/scale            # where the report goes
    folder: "{stage}/{point}"         # a grid point's runs, under out and runs (optional; the default);
                                      # {stage}, {point} (its overrides) or any grid key: "{encoding}";
                                      # a stage's own ``folder:`` replaces it for that stage
    common: [experiment=scale]        # overrides every run shares
    stages:                           # in order; ``--only`` picks some
      - name: small
        grid: {model: [small], encoding: [rope, alibi], seed: [0, 1, 2]}
        overrides: [train.compile=false]   # this stage's own (optional)
    report:
      by: [model.name]                # posbench report --by
      per: [model.name]               # keys of by whose values split the verdicts' setups (--per; optional)
      dirs: [results/baselines/headline]   # reported beside the study's runs (optional)
      args: [--log-y]                 # any other posbench report flags
      contrasts: [[{encoding: p_rope}, {encoding: rope}]]   # line A's ratio over line B's (posbench
                                      # report --contrast), each line by its key (its data:
                                      # posbench.report.keys) or its label
      tables: {encodings.md: encodings}   # FILE: a table of report.csv written to results/FILE: one of
                                      # posbench.report.encoding_table.TABLES, or a script of your
                                      # own (FILE.py, run on report.csv, its output kept; optional)
      longppl: {evaluator: "gemma3-270m/bos=first", short: 4096}   # LongPPL of every folder of the
                                      # study on the key tokens of the folder under out named here
                                      # (posbench longppl --evaluator; short, short_stride, long, alpha,
                                      # beta: its options of those names), written to runs/longppl.csv
                                      # after each sweep and before the report, which reads it, the
                                      # key tokens to runs/longppl_keys.npz (optional); its
                                      # sensitivity: {alpha0.5: {alpha: 0.5}} (NAME: a change of short,
                                      # short_stride, long, alpha or beta) the same on the key tokens so
                                      # chosen, to runs/longppl_NAME.csv and the report's
                                      # results/longppl_NAME.md (optional)

A run is keyed by its config hash and seed, not by its path: ``posbench study`` composes each
run's config as ``posbench train`` would, and trains only the runs whose (hash, seed) neither an
exported run under ``runs`` nor a finished run dir under ``out`` holds. Re-running resumes: an
unfinished run trains on in the same run dir (``posbench train`` resumes from its checkpoint).
An algorithmic task's run (``task=copy``, ...) writes tasks.csv instead of results.csv: it is
keyed by that file's hash and seed, and exported as its tasks.csv and config.yaml.

The runs of one grid point that differ only in seed go to Hydra's ``local_parallel`` launcher as
one sweep (``posbench -m train ... seed=0,1,2``); several such sweeps run side by side until
``--jobs`` runs are going. Each sweep's finished runs are exported as soon as it ends, so a study
cut off (a time limit, a lost machine) keeps every run that finished. Then ``posbench report``
draws the exported runs.

The hash of a run that starts from another (``train.init_from``) covers its parent's hash, which
exists only once the parent has trained: such runs are keyed by their run dir alone.

**A stage that starts from another's runs** names it with ``from:``; ``{from}`` in its overrides
is the run dir of the same grid point (the grid keys both stages have) and seed in that stage::

      - name: long                    # 20M tokens, keeping the shorter budgets' branch points
        grid: {encoding: [alibi, rope], seed: [0, 1, 2]}
        overrides: [train.schedule=wsd, "train.save_steps=[977,390]"]
      - name: steps1221               # its decay from the long run's checkpoint at step 977
        from: long
        grid: {encoding: [alibi, rope], seed: [0, 1, 2]}
        overrides: [train.schedule=wsd, train.steps=1221, "train.branch_from={from}"]

A sweep of such a stage starts only once its parent sweep has ended (and not at all when the
parent failed): its checkpoints live in the parent's run dirs under ``out``, so a parent and its
branches train on one machine.

**An eval stage** (``eval: true``, with ``from:``) trains nothing: it runs ``posbench eval`` on each
run of the stage its ``from:`` names (the same grid point and seed), as
``posbench -m eval checkpoint=<run dir>,... <overrides>``. Its grid keys that the parent's grid has
pick the parent's point; its other grid keys (``eval.rope_scaling: [pi, yarn]``) and its overrides
are the evaluation's (``eval.*``, and of ``--extra`` only ``device``, ``eval.*`` and ``precision``)::

      - name: sliding
        eval: true
        from: headline
        grid: {encoding: [alibi, rope], seed: [0, 1, 2]}
        overrides: [eval.mode=sliding, eval.stride=64, "eval.lengths=[256,512,1024,2048]"]

Its runs are its parent's: the rows go to the parent's run dirs (``out/<folder>/seed=N``) and the
run is exported, with every row it holds, to the parent's ``runs/<folder>/seed=N``. An evaluation
is done (:func:`evaluated`) when its run dir holds the rows ``posbench eval`` would otherwise
compute, by the eval's own test (``posbench.eval.ladder.ladder_plan``: rows of results.csv with the
evaluation's key (split, mode, stride, rope_scaling, eval_len), the run's config hash and scored
token count, status ok, and their per-token NLL kept); where only the export is left, when its
results.csv has an ok row of the run's config hash under that key at every length. An eval sweep
starts once its parent's sweep and every earlier sweep on the same run dirs has ended (``posbench
eval`` holds the run dir), and an export is written again when its run's results.csv holds a row
(key and config hash) the export lacks; a training run's export is written once, when it ends.
To evaluate another study's runs, an eval study names that study's stage as its own first stage,
with the same config, ``out`` and ``folder`` (conf/study/rope_scaling.yaml, headline_sliding.yaml):
the runs are then done in both, and trained by whichever runs first (an evaluation needs the run
dir's checkpoint: a run whose only copy is an export is done for training, not for a new
evaluation). An eval stage may run a probe (``probe=passkey`` in its overrides): it is done when the
probe's csv in the run dir or its export holds rows of the run's config hash under the
evaluation's label at every length the probe runs (:func:`_probed`), and the probe's csv travels
with the export.

**A pretrained stage** (``pretrained: NAME``, a model name of ``posbench eval pretrained=`` or a
path) trains nothing: each grid point is one ``posbench eval pretrained=NAME out=<out/folder>``
with the point's and the stage's overrides (``eval.*``, ``bos``, ``precision``, ``probe=...``), no
seeds. Every stage of one model names the same folder (``folder: "{pretrained}"``, ``{pretrained}``
being the model's name), so a method's lengths that leave the model as trained reuse the unscaled
rows there, and the sweeps on one folder run one after another::

      - name: ladder
        pretrained: smollm2-135m
        grid: {eval.rope_scaling: [none, pi, ntk, dynamic_ntk, yarn]}
        overrides: ["eval.lengths=[1024,2048,4096,8192,16384,32768]", eval.max_tokens=32768]
      - name: passkey
        pretrained: smollm2-135m
        grid: {}
        overrides: [probe=passkey, "probe.lengths=[2048,4096,8192,16384]", "probe.depths=[0,0.5,1]"]

What is done is read without the weights (the model's config and tokenizer,
:func:`pretrained_left`): a ladder sweep is done when ``posbench eval`` would compute no length,
a probe sweep runs only the lengths whose rows its csv lacks. The folder is exported to
``runs/<folder>`` (results, per-block sums, every probe's csv) as its rows come, keeping the rows of
an earlier export that a folder made again lacks; an export alone also counts as done.

The package, cut by concern, each module importing only the ones above it in this list:

- :mod:`.spec`: a study file read and checked (:class:`Study`, :func:`load_study`,
  :func:`study_files`) and its stages' grid points as :class:`Sweep` s (:func:`sweeps`: folders,
  parents, eval and pretrained sweeps);
- :mod:`.planning`: what is done and what is left, composed and read, never run: a sweep's config
  hash (:func:`sweep_hash`), the finished and exported runs (:func:`plan`), an eval stage's rows
  (:func:`evaluated`) and a pretrained stage's (:func:`pretrained_left`). Not ``plan.py``: the
  function :func:`plan` imported here would hide a module of that name (``import
  posbench.study.plan`` would give the function);
- :mod:`.run`: running it: the command each sweep runs, the scheduler that runs sweeps side by side
  and exports their runs as they end (:func:`train`), the exports, the report and :func:`main`.

Their public names are imported here too (``from posbench.study import load_study, plan``). A test
that replaces one (``monkeypatch.setattr``) replaces it in the module that defines it, where its
callers look it up: :func:`train` calls ``posbench.study.run``'s ``train_command`` and ``export``.
"""

from .planning import (
    EVAL_EXTRA,
    eval_extra,
    evaluated,
    finished,
    plan,
    pretrained_left,
    pretrained_overrides,
    seed_major,
    sweep_hash,
)
from .run import (
    EXPORT_EVERY,
    command,
    eval_command,
    export,
    export_pretrained,
    log_path,
    main,
    pretrained_command,
    report,
    report_command,
    train,
    train_command,
)
from .spec import (
    FOLDER,
    REPORT_KEYS,
    STAGE_KEYS,
    STUDY_KEYS,
    Study,
    Sweep,
    load_study,
    parse_where,
    restrict,
    study_files,
    sweeps,
)

__all__ = ["FOLDER", "REPORT_KEYS", "STAGE_KEYS", "STUDY_KEYS", "Study", "Sweep", "load_study", "parse_where",
           "restrict", "study_files", "sweeps",
           "EVAL_EXTRA", "eval_extra", "evaluated", "finished", "plan", "pretrained_left", "pretrained_overrides",
           "seed_major", "sweep_hash", "EXPORT_EVERY", "command", "eval_command", "export", "export_pretrained",
           "log_path", "main", "pretrained_command", "report", "report_command", "train", "train_command"]
