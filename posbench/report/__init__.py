"""Stage 5, report: results rows from many run dirs -> tables and figures, by job:
:mod:`.collect` (the rows, and the checks that they make one report), :mod:`.summary` (means and
intervals), :mod:`.verdicts` (what the intervals decide), :mod:`.render` (Markdown and LaTeX
tables, the summary's sentences), :mod:`.figures` and :mod:`.learned_bias` (drawings), and
:mod:`.build`, which puts one report together as :class:`~.build.ReportOptions` ask;
:mod:`.tasks` for the algorithmic tasks."""
