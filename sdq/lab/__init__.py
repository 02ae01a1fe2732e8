"""The lab: parameter sets, notebook outputs, the reproduce runner and the docs renderer.

Notebooks use `Outputs`; `python -m sdq.lab.reproduce` runs them, `python -m sdq.lab.docs`
renders docs/ from what they wrote.
"""

from sdq.lab.outputs import Outputs
from sdq.lab.params import Params, load_params

__all__ = ["Outputs", "Params", "load_params"]
