"""``posbench study NAME``: train what a study file's runs lack, then report; :mod:`posbench.study` runs it."""

HELP = "train the runs a study (conf/study/<name>.yaml) lacks, side by side, then report them"


def main(args: list[str]) -> None:
    from ..study import main as study

    study(args)
