"""sdq: run Mixture-of-Experts GGUF models larger than RAM by paging routed experts from SSD.

`sdq.load(path, ram_budget_mb=..., **settings)` opens a model for generation (sdq.api); the
package imports nothing heavy until it is called.
"""

__version__ = "0.1.0"


def load(model, *, ram_budget_mb=None, **settings):
    """Open a GGUF model for generation: see sdq.api.load."""
    from sdq.api import load as load_model

    return load_model(model, ram_budget_mb=ram_budget_mb, **settings)
