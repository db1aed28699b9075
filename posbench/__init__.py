"""posbench: train short, test long. A benchmark for length extrapolation of position encodings.

The package is laid out as the pipeline runs, one stage a folder; data flows one way and no
module imports one of a later stage (``tests/test_structure.py`` enforces the order):

==========  ==================================================================================
base        :mod:`.errors`, :mod:`.config` (typed run config, torch-free), :mod:`.intervals`
            (95% intervals, pure statistics) and :mod:`.runs` (run dirs, locks, processes)
data        :mod:`.data`: corpora -> cached token ids; algorithmic tasks
model       :mod:`.encodings` (the hook interface and registry), :mod:`.attention`,
            :mod:`.model`, :mod:`.loss`, :mod:`.build` (config -> model), :mod:`.preflight`
            (a model's memory before it runs), :mod:`.pretrained` (Hugging Face models behind
            the same interface)
eval        :mod:`.eval`: the perplexity ladder, probes, per-token NLL, the results schema
train       :mod:`.train`: the loop, optimizer, branching, logger; it evaluates its model when
            it finishes, so it comes after eval (as a trainer holds its validator)
report      :mod:`.report`: tables and figures from many run dirs
app         :mod:`.cli`, :mod:`.bench`, :mod:`.convert`: the commands, which call the stages
==========  ==================================================================================
"""

__version__ = "0.1.0"
