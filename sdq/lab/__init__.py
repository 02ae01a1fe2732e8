"""The lab: parameter sets, notebook outputs, the reproduce runner and the docs renderer.

Adding a notebook `NN_topic`:

1. notebooks/NN_topic.ipynb: a markdown title and question, then ONE code cell tagged
   `parameters` (first code cell) with `params_name = "scratch"`, `model_path = ""` and the
   notebook's own defaults; commit it without outputs.
2. In it, `out = Outputs("NN_topic", params_name)`, then `out.table("T5", df, title=..., note=...)`,
   `out.chart("name", altair_chart, alt="what the chart shows")` and `out.value("name",
   number)` for figures quoted in prose;
   each seed claim the notebook tests is judged by the lab's one rule and recorded with
   `out.verdict(claim, judge(claim, pairs, why=...))` (sdq.lab.verdict).
3. params/default.yaml and params/smoke.yaml: a section `NN_topic: {param: value, ...}`
   (types must match the notebook's defaults; smoke is what `make test` runs).
4. docs/src/NN_topic.md: prose with {{table:T5}}, {{chart:name}}, {{value:name}} (or
   {{value:name:.1f}}); `make docs` renders docs/NN_topic.md.
5. `make reproduce` (or `python -m sdq.lab.reproduce --params default --only NN_topic`), then
   commit outputs/NN_topic/default/ and docs/.

May import: everything but sdq.commands and sdq.cli.
"""

from sdq.lab.outputs import Outputs
from sdq.lab.params import Params, load_params

__all__ = ["Outputs", "Params", "load_params"]
