"""The bench: experiments on top of the library (``tvr bench``, ``tvr bench report``, ``tvr synth``, ``tvr demo``),
imported by the CLI alone.

* ``synthetic`` (with ``photos``): captioned video sets with dials (false negatives, temporal twins, vague captions,
  …), rendered as real mp4 files in MSR-VTT's annotation format (``tvr synth``; a bench's ``synth:`` section);
* ``demo``: ``tvr demo``, one method trained end to end on a synthetic set on CPU;
* ``runs``: a bench of methods × seeds on one data set (a rendered synthetic set or an annotation folder), each run
  in this process or a worker process, its record sealed (``results.json``);
* ``sweep``: one bench per value of a synthetic dial, and the pre-registered hypotheses it decides;
* ``composition``: the check that validation poses the test's task;
* ``stats``: the statistics (intervals, paired t tests, Holm, detectable differences, trend tests), pure functions;
* ``report``, ``records``, ``results_document``: tables and plots, the checked reading of a sealed record, and the
  results document (docs/results.md) written from committed records through a template.
"""
